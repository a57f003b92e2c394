"""One run of a date at a time: `<run>/.lock`, held by the run's whole process tree.

Every entry point that writes under a date takes it: FullRun, each stage's Luigi task and each
stage's command line (`python -m preprocess run`, `python -m train launch`, `python -m
evaluate`). The lock is an advisory `flock` on the file, so the kernel frees it when the last
descriptor of it closes, for any reason (crash and SIGKILL included): a stale lock cannot
outlive its owners and needs no pid probing. The file's text names the holder (pid, host,
start, command) for the message a refused run prints.

The holder passes the descriptor on to the processes it starts (`held_fds()` for Popen's
`pass_fds`; forked luigi workers inherit it anyway) and names it in INHERITED_ENV; a stage
started so adopts the lock instead of being refused by its own parent. The lock then stays
held while any process of the tree runs: a SIGKILLed luigi does not let a new run of the date
in while its train launcher still stops the workers. A stage in a container cannot inherit a
descriptor: the process that starts the container holds the lock and sets HELD_OUTSIDE_ENV
for it.

flock is local to one machine: keep `output_root` on a local disk (or run one scheduler host)
for the guarantee to hold. For a remote output_root (gs://...) the lock file lives in the run
folder's local state folder instead (`contract.storage.local_state_dir`), so the lock holds
per machine only.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import fcntl
import json
import os
import posixpath
import socket
import sys

from contract import storage

LOCK_FILE = ".lock"
# {lock file path: descriptor} of the locks the parent process holds and passed on.
INHERITED_ENV = "NIGHTLY_RUN_LOCKS"
# "1" in a stage container: the process that started the container holds the date's lock.
HELD_OUTSIDE_ENV = "NIGHTLY_RUN_LOCK_HELD_OUTSIDE"


class RunLockedError(RuntimeError):
    """Another process is running the same date."""


class RunLock:
    """The per-date lock of one run folder."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.lock_dir = storage.local_state_dir(run_dir)  # flock needs a local file
        # Absolute: a stage started in another folder must find its parent's lock by name.
        self.path = os.path.abspath(os.path.join(self.lock_dir, LOCK_FILE))
        self._fd: int | None = None
        self._adopted = False

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
                    "itself when that process and every stage process it started have exited."
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

    def adopt(self) -> bool:
        """Takes over the descriptor of this lock that the parent process passed on.

        Returns:
            True when this process was started holding the lock (see INHERITED_ENV).
        """
        try:
            fd = int(json.loads(os.environ.get(INHERITED_ENV, "{}")).get(self.path, -1))
            inherited = os.fstat(fd)
            current = os.stat(self.path)
        except (ValueError, TypeError, AttributeError, OSError):
            return False
        # The same number may name another file here, if the parent did not pass it on.
        if (inherited.st_dev, inherited.st_ino) != (current.st_dev, current.st_ino):
            return False
        self._fd, self._adopted = fd, True
        return True

    def release(self) -> None:
        """Removes the file while still holding it, then lets go.

        An adopted lock is only let go of here: the process that took it removes the file.
        """
        if self._fd is None:
            return
        if not self._adopted:
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


def is_free(run_dir: str) -> bool:
    """Whether the date's lock can be taken now: taken and let go at once (removing a file a
    dead holder left). Unlike `in_progress`, a lock still held by a stage process whose
    starter is gone counts as held, as it does for the next run of the date."""
    lock = RunLock(run_dir)
    try:
        lock.acquire()
    except RunLockedError:
        return False
    lock.release()
    return True


def in_progress(run_dir: str) -> bool:
    """Whether a run of the date seems to be under way, read without touching the lock.

    A holder removes the file when it lets go, so no file means no run. A file left by a
    killed holder names a pid that is gone on this host; a file whose holder is on another host
    or has not written its name yet counts as a run under way.
    """
    path = RunLock(run_dir).path
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            holder = json.loads(f.read() or "{}")
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True
    if not isinstance(holder, dict) or holder.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(holder["pid"]), 0)
    except (KeyError, TypeError, ValueError):
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True


_held: dict[str, RunLock] = {}


def hold_for_process(run_dir: str) -> bool:
    """Takes the run's lock for the rest of this process's life (idempotent), or adopts the
    one its parent holds and passed on; processes it starts may adopt it in turn.

    Returns:
        True when this call took the lock, False when this process already held it (itself
        or through its parent).

    Raises:
        RunLockedError: another process holds it.
    """
    if run_dir in _held:
        return False
    if os.environ.get(HELD_OUTSIDE_ENV) == "1":
        return False
    lock = RunLock(run_dir)
    took = not lock.adopt()
    if took:
        lock.acquire()
    _held[run_dir] = lock
    fds = {held.path: held._fd for held in _held.values()}
    os.environ[INHERITED_ENV] = json.dumps(fds, sort_keys=True)
    return took


def held_here(run_dir: str) -> bool:
    """Whether this process holds the run's lock (taken here or adopted from its parent)."""
    path = RunLock(run_dir).path
    return any(lock.path == path and lock.held for lock in _held.values())


def held_fds() -> tuple[int, ...]:
    """The descriptors of the locks this process holds: `pass_fds` for the stages it starts."""
    return tuple(lock._fd for lock in _held.values() if lock._fd is not None)


def run_dir_of_train_dir(train_dir: str) -> str:
    """The run folder a train folder belongs to (`<run>/train`): the folder holding it."""
    path = train_dir.rstrip("/")
    if not storage.is_remote(path):
        path = os.path.abspath(path)
    return posixpath.dirname(path) or "/"


@atexit.register
def _release_all() -> None:
    for lock in _held.values():
        lock.release()
    _held.clear()
    os.environ.pop(INHERITED_ENV, None)
