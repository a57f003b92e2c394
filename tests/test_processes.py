"""A child started with contract.processes' preexec_fn dies with its parent, however it dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from contract import processes
from tests.factories import PROJECT_ROOT
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")

# Starts `sleep` tied to this process, prints its pid, then waits to be killed.
PARENT = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    from contract import processes
    child = subprocess.Popen(
        ["sleep", "60"], preexec_fn=processes.signal_when_parent_dies(signal.{sig})
    )
    print(child.pid, flush=True)
    time.sleep(60)
    """
)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie left for init to reap counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_the_child_dies_when_its_parent_is_killed(sig):
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT.format(sig=sig)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
    wait_until(
        lambda: not _alive(child),
        timeout=30,
        failure=lambda: f"child {child} outlived its {sig}ed parent",
    )


def test_a_parent_gone_before_the_child_was_armed_still_ends_it():
    # The preexec_fn made here names this process as the parent; the child's real parent is a
    # forked copy, as if this process had died and the child been handed to another one.
    arm = processes.signal_when_parent_dies(signal.SIGTERM)
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the forked copy: never returns into pytest
        try:
            code = subprocess.Popen(["sleep", "60"], preexec_fn=arm).wait(timeout=30)
            os.write(writer, str(code).encode())
        finally:
            os._exit(0)
    os.close(writer)
    try:
        with os.fdopen(reader) as f:
            assert f.read() == str(-signal.SIGTERM)
    finally:
        os.waitpid(pid, 0)
