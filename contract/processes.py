"""Tying a child process's life to its parent's: the child gets a signal when the parent dies.

Every program a stage or the pipeline starts (a stage command, a train worker, a worker's
`docker run` client) must not outlive the process that started it, even when that process is
SIGKILLed and cannot clean up: a leftover worker would hold its port, a leftover client its
container. Linux's parent-death signal (PR_SET_PDEATHSIG) does that; elsewhere it is a no-op.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def signal_when_parent_dies(sig: signal.Signals) -> Callable[[], None]:
    """A `preexec_fn` for `subprocess.Popen` that makes the child get `sig` when this process dies.

    The kernel sends the signal when the thread that started the child ends, so start children
    from a thread that lives as long as they should. A parent that died between the fork and
    the `prctl` would never send it: the child then sees another parent and signals itself.

    Args:
        sig: SIGTERM for a child that stops its own children first (the train launcher, a
            `docker run` client, which forwards it to its container); SIGKILL for one that
            has nothing to clean up.

    Returns:
        The function to pass as `preexec_fn`; call this in the parent, just before Popen.
    """
    parent = os.getpid()
    # Looked up here, in the parent: the child between fork and exec should only call into it.
    prctl = libc_prctl()

    def arm() -> None:
        if prctl is None:
            return
        with contextlib.suppress(OSError):
            prctl(PR_SET_PDEATHSIG, int(sig))
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return arm


def libc_prctl() -> Callable[..., int] | None:
    """libc's `prctl(2)`, or None where there is none (not Linux)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
