"""One side of test_pointer_race.py's race, as a program: `python -m
tests.evaluate.race_evaluation OUTPUT_ROOT DATE MARKERS ROLE`.

A program rather than a function so that the suite's fork server (contract.spawn) can start it
with TensorFlow already imported.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys

from contract import pointer
from evaluate import EvaluateConfig, stage
from tests.evaluate.conftest import placeholder_pictures
from tests.waiting import wait_until

LATER_WAITS = "later-waits-at-the-lock"
LATER_MOVED = "later-moved-the-pointer"
EARLIER_READ = "earlier-read-the-pointer"


def evaluate(output_root: str, date: str, markers: str, role: str) -> None:
    """Runs one evaluation; `earlier` pauses after reading the pointer until `later` waits at
    the pointer lock or has moved the pointer, and `later` says which of the two happened."""

    def mark(name: str) -> None:
        open(os.path.join(markers, name), "w").close()

    if role == "earlier":
        read = pointer.read_versioned

        def read_then_hold(root: str):
            current = read(root)
            mark(EARLIER_READ)
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


if __name__ == "__main__":
    evaluate(*sys.argv[1:])
