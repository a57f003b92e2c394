"""Two dates evaluated at once (a backfill during the nightly run): the pointer ends on the later.

The earlier date's evaluation is held between reading the pointer and moving it; the later
date's evaluation starts in that window. Without the shared lock both would read "no pointer",
the later would move it first and the held earlier one would move it back.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import time

import pytest

from contract import layout, pointer
from evaluate import EvaluateConfig
from tests.evaluate.conftest import DATE
from tests.waiting import wait_until

LATER = "2026-02-01"
# Once the later evaluation is at the lock, the held earlier one waits this long: enough for
# an unlocked later evaluation to decide and move the pointer (about a second here).
HOLD_AFTER_LATER_SECONDS = 4.0


def _evaluate(output_root: str, date: str, markers: str, role: str) -> None:
    """Runs one evaluation; `earlier` pauses after reading the pointer until `later` is at the
    pointer lock, and `later` says when it gets there."""
    import contextlib

    from evaluate import stage

    at_lock = os.path.join(markers, "later-at-the-lock")
    if role == "earlier":
        read = pointer.read

        def read_then_hold(root: str):
            current = read(root)
            open(os.path.join(markers, "earlier-read-the-pointer"), "w").close()
            deadline = time.monotonic() + 120
            while not os.path.exists(at_lock) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(HOLD_AFTER_LATER_SECONDS)
            return current

        pointer.read = read_then_hold  # type: ignore[assignment]
    else:
        lock = pointer.pointer_lock

        @contextlib.contextmanager
        def announced_lock(root: str):
            open(at_lock, "w").close()
            with lock(root):
                yield

        pointer.pointer_lock = announced_lock  # type: ignore[assignment]
    config = EvaluateConfig(output_root=output_root, date=date, batch_size=128, max_regression=0.01)
    stage.run(config)


@pytest.mark.e2e
def test_two_dates_at_once_leave_the_pointer_on_the_later_blessed_date(run_root, tmp_path):
    shutil.copytree(run_root / DATE, run_root / LATER)
    markers = str(tmp_path)
    marker = os.path.join(markers, "earlier-read-the-pointer")
    spawn = multiprocessing.get_context("spawn")
    earlier = spawn.Process(target=_evaluate, args=(str(run_root), DATE, markers, "earlier"))
    later = spawn.Process(target=_evaluate, args=(str(run_root), LATER, markers, "later"))
    earlier.start()
    try:
        wait_until(
            lambda: os.path.exists(marker),
            timeout=120,
            failure=lambda: "the earlier date's evaluation never read the pointer",
            alive=earlier.is_alive,
        )
        later.start()
        later.join(timeout=180)
        earlier.join(timeout=180)
    finally:
        for process in (earlier, later):
            if process.is_alive():
                process.kill()
    assert earlier.exitcode == 0 and later.exitcode == 0
    current = pointer.read(str(run_root))
    assert current is not None and current["date"] == LATER
    assert pointer.is_complete(str(run_root), current)
    for date in (DATE, LATER):
        assert os.path.exists(layout.join(layout.evaluate_dir(str(run_root), date), "metrics.json"))
