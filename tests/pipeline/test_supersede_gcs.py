"""`--force-stage` on gs:// never overwrites a latest pointer another host moved meanwhile.

Two hosts share no lock, only the bucket (tests.gcs_emulator). The superseding host runs in
its own process with its own local state folder; just before one of its pointer writes it is
held until the other host (this test's process) has moved the pointer. Its write, carrying the
generation it read, is then refused, and it decides again on the pointer as it now is: it
leaves another date's blessing alone, and follows its own date's model when the other host
rewrote the pointer to it. Without the precondition it wrote its stale decision over them.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from contract import pointer, spawn
from pipeline import supersede
from tests.evaluate.test_pointer_gcs import gcs, root  # noqa: F401 - the emulator's fixtures
from tests.factories import PROJECT_ROOT
from tests.pipeline.supersede_host import DATE, LATER, blessed
from tests.waiting import wait_until


def _race(output_root: str, tmp_path, held_write: int, other: dict[str, Any]) -> dict[str, Any]:
    """Runs the superseding host; moves the pointer to `other` while its write is held."""
    markers = tmp_path / "markers"
    markers.mkdir()
    argv = [sys.executable, "-m", "tests.pipeline.supersede_host", output_root]
    argv += [str(tmp_path / "host"), str(markers), str(held_write)]
    # Forked from the session's fork server, as the pipeline starts its stages.
    host = spawn.popen(argv, cwd=str(PROJECT_ROOT))
    try:
        wait_until(
            lambda: (markers / "read").exists(),
            timeout=180,
            failure=lambda: "the superseding host never came to its pointer write",
            alive=lambda: host.poll() is None,
        )
        pointer.update(output_root, lambda current: other)  # the other host, with its own lock
        (markers / "moved").touch()
        host.wait(timeout=180)
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
    assert host.returncode == 0
    result: dict[str, Any] = json.loads((markers / "result.json").read_text())
    assert result["train_left"] is False  # the stage moved all the same
    return result


@pytest.mark.parametrize("held_write", [1, 2], ids=["before-the-keep", "after-the-move"])
def test_another_dates_blessing_is_not_overwritten(root, tmp_path, held_write):  # noqa: F811
    result = _race(root, tmp_path, held_write, blessed(LATER))
    assert result["pointer"] == blessed(LATER)
    assert result["model"] == LATER


def test_a_rewritten_pointer_to_the_moved_model_is_followed(root, tmp_path):  # noqa: F811
    rewritten = blessed(DATE, updated_utc="by the other host")
    result = _race(root, tmp_path, 1, rewritten)
    assert result["pointer"]["updated_utc"] == "by the other host"  # its write, not the stale one
    assert "/superseded/" in result["pointer"]["model_path"]
    assert supersede.KEEP_DIR not in result["pointer"]["model_path"]
    assert result["model"] == DATE
    assert result["writes"] == 3  # refused once, then to the keep folder and to the new place
