"""cron/nightly.crontab goes beside a user's crontab, and installing it again changes nothing."""

from __future__ import annotations

import re
import subprocess

from tests.factories import PROJECT_ROOT

# The install command docs/operations.md gives, with a file standing in for `crontab -l`.
INSTALL = (
    "(sed '/^# BEGIN nightly-trainer/,/^# END nightly-trainer/d' {current}; "
    "cat cron/nightly.crontab) > {installed}"
)


def _install(current, installed) -> str:
    subprocess.run(
        INSTALL.format(current=current, installed=installed),
        shell=True,
        check=True,
        cwd=PROJECT_ROOT,
    )
    return installed.read_text()


def test_the_documented_install_keeps_the_users_lines_and_is_idempotent(tmp_path):
    docs = (PROJECT_ROOT / "docs" / "operations.md").read_text()
    assert (
        "sed '/^# BEGIN nightly-trainer/,/^# END nightly-trainer/d'; cat cron/nightly.crontab"
        in docs
    )
    mine = tmp_path / "mine"
    mine.write_text("# my own\n0 5 * * * echo hi\n")
    once = _install(mine, tmp_path / "once")
    twice = _install(tmp_path / "once", tmp_path / "twice")
    assert once == twice
    assert once.startswith("# my own\n0 5 * * * echo hi\n")
    assert once.count("pipeline FullRun --local-scheduler") == 1
    # One log a night, never one that grows without end.
    assert re.search(r"runs/cron/\$\(date \+\\%F\)\.log", once)
    assert "cron.log" not in once
