"""Two dates evaluated at once (a backfill during the nightly run): the pointer ends on the later.

The earlier date's evaluation is held between reading the pointer and moving it until the later
date's evaluation has either moved the pointer (no shared lock: the held earlier one would then
move it back) or is found waiting on the lock. Both are events, not a length of time, so the
test holds exactly as long as the race needs on a fast or a slow machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from contract import layout, pointer, spawn
from tests.evaluate.conftest import DATE
from tests.evaluate.race_evaluation import EARLIER_READ
from tests.factories import PROJECT_ROOT
from tests.waiting import wait_until

LATER = "2026-02-01"


def _start(output_root: str, date: str, markers: str, role: str) -> spawn.Process:
    """One side of the race (tests/evaluate/race_evaluation.py), forked from the suite's fork
    server when there is one, as the pipeline starts its stages."""
    program = [sys.executable, "-m", "tests.evaluate.race_evaluation"]
    env = os.environ | {"PYTHONPATH": str(PROJECT_ROOT)}
    return spawn.popen(
        [*program, output_root, date, markers, role], env=env, stdout=subprocess.DEVNULL
    )


@pytest.mark.e2e
def test_two_dates_at_once_leave_the_pointer_on_the_later_blessed_date(run_root, tmp_path):
    shutil.copytree(run_root / DATE, run_root / LATER)
    markers = str(tmp_path)
    marker = os.path.join(markers, EARLIER_READ)
    earlier = _start(str(run_root), DATE, markers, "earlier")
    later = None
    try:
        wait_until(
            lambda: os.path.exists(marker),
            timeout=120,
            failure=lambda: "the earlier date's evaluation never read the pointer",
            alive=lambda: earlier.poll() is None,
        )
        later = _start(str(run_root), LATER, markers, "later")
        later.wait(timeout=180)
        earlier.wait(timeout=180)
    finally:
        for process in (earlier, later):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    assert earlier.returncode == 0 and later.returncode == 0
    current = pointer.read(str(run_root))
    assert current is not None and current["date"] == LATER
    assert pointer.is_complete(str(run_root), current)
    for date in (DATE, LATER):
        assert os.path.exists(layout.join(layout.evaluate_dir(str(run_root), date), "metrics.json"))
