"""Polling with a deadline, so a broken run fails its test instead of hanging it.

The deadline bounds a wait for an event (a log line, a lock file, a port); it is not a
speed check: speed is measured in bench/.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_until(
    condition: Callable[[], bool],
    *,
    timeout: float,
    failure: Callable[[], str],
    alive: Callable[[], bool] = lambda: True,
    interval: float = 0.05,
) -> None:
    """Returns once `condition()` holds; fails the test with `failure()` if `alive()` turns
    false first or `timeout` seconds pass."""
    give_up_at = time.monotonic() + timeout
    while not condition():
        now = time.monotonic()
        if not alive() or now > give_up_at:
            pytest.fail(failure())
        time.sleep(interval)
