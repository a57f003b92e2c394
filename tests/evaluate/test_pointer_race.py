"""Two dates evaluated at once (a backfill during the nightly run): the pointer ends on the later.

The earlier date's evaluation is held between reading the pointer and moving it until the later
date's evaluation has either moved the pointer (no shared lock: the held earlier one would then
move it back) or is found waiting on the lock. Both are events, not a length of time, so the
test holds exactly as long as the race needs on a fast or a slow machine.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil

import pytest

from contract import layout, pointer
from evaluate import EvaluateConfig
from tests.evaluate.conftest import DATE, placeholder_pictures
from tests.waiting import wait_until

LATER = "2026-02-01"
LATER_WAITS = "later-waits-at-the-lock"
LATER_MOVED = "later-moved-the-pointer"


def _evaluate(output_root: str, date: str, markers: str, role: str) -> None:
    """Runs one evaluation; `earlier` pauses after reading the pointer until `later` waits at
    the pointer lock or has moved the pointer, and `later` says which of the two happened."""
    import contextlib
    import fcntl

    from evaluate import stage

    def mark(name: str) -> None:
        open(os.path.join(markers, name), "w").close()

    if role == "earlier":
        read = pointer.read_versioned

        def read_then_hold(root: str):
            current = read(root)
            mark("earlier-read-the-pointer")
            wait_until(
                lambda: any(
                    os.path.exists(os.path.join(markers, m)) for m in (LATER_WAITS, LATER_MOVED)
                ),
                timeout=120,
                failure=lambda: (
                    "the later date's evaluation neither waited at the lock nor moved the pointer"
                ),
            )
            return current

        pointer.read_versioned = read_then_hold  # type: ignore[assignment]
    else:
        lock, write = pointer.pointer_lock, pointer.write

        @contextlib.contextmanager
        def announced_lock(root: str):
            # A non-blocking try on the same lock file: it fails only while another holds it.
            with open(pointer._lock_file(root), "a") as f:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    mark(LATER_WAITS)
                else:
                    fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            with lock(root):
                yield

        def announced_write(root: str, value, **kwargs):
            write(root, value, **kwargs)
            mark(LATER_MOVED)

        pointer.pointer_lock = announced_lock  # type: ignore[assignment]
        pointer.write = announced_write  # type: ignore[assignment]
    config = EvaluateConfig(output_root=output_root, date=date, batch_size=128, max_regression=0.01)
    with placeholder_pictures():  # the race is about the pointer; test_stage.py checks pictures
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
