"""One run of a date at a time: `<run>/.lock`, held by the luigi process for as long as it lives.

The lock is an advisory `flock` on the file, so the kernel frees it when the holding process
exits for any reason (crash and SIGKILL included): a stale lock cannot outlive its owner and
needs no pid probing. The file's text names the holder (pid, host, start, command) for the
message a refused run prints. Forked luigi workers inherit the descriptor, so the lock stays
held while any of them still runs. flock is local to one machine: keep `output_root` on a
local disk (or run one scheduler host) for the guarantee to hold. For a remote output_root
(gs://...) the lock file lives in the run folder's local state folder instead
(`contract.storage.local_state_dir`), so the lock holds per machine only.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import fcntl
import json
import os
import socket
import sys

from contract import storage

LOCK_FILE = ".lock"


class RunLockedError(RuntimeError):
    """Another process is running the same date."""


class RunLock:
    """The per-date lock of one run folder."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.lock_dir = storage.local_state_dir(run_dir)  # flock needs a local file
        self.path = os.path.join(self.lock_dir, LOCK_FILE)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Takes the lock without waiting.

        Raises:
            RunLockedError: naming the process that holds it.
        """
        if self._fd is not None:
            return
        os.makedirs(self.lock_dir, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise RunLockedError(
                    f"run {self.run_dir} is already in progress ({holder}); refusing to start "
                    "a second run of the same date. Wait for it to finish: the lock frees "
                    "itself when that process exits."
                ) from None
            # A releasing holder unlinks the file: make sure ours is still the one at the path.
            try:
                current = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                break
            os.close(fd)
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv),
        }
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(me) + "\n").encode())
        self._fd = fd

    def release(self) -> None:
        """Removes the file while still holding it, then lets go."""
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None


def _read_holder(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 4096).decode(errors="replace").strip()
    try:
        info = json.loads(text)
        return (
            f"locked by pid {info['pid']} on {info['host']} since {info['started_utc']}: "
            f"{info['command']}"
        )
    except (ValueError, KeyError, TypeError):
        return "locked by a process that has not written its name yet"


_held: dict[str, RunLock] = {}


def hold_for_process(run_dir: str) -> bool:
    """Takes the run's lock for the rest of this process's life (idempotent).

    Returns:
        True when this call took the lock, False when this process already held it.

    Raises:
        RunLockedError: another process holds it.
    """
    if run_dir in _held:
        return False
    lock = RunLock(run_dir)
    lock.acquire()
    _held[run_dir] = lock
    return True


@atexit.register
def _release_all() -> None:
    for lock in _held.values():
        lock.release()
    _held.clear()
