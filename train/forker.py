"""The local workers' forker: one process imports the worker's code and forks every worker.

Importing TensorFlow and tf_keras is most of what a small worker costs to start (about 4
CPU-seconds); a local cluster of N workers restarted R times would pay it N x (R + 1) times.
The local backend instead starts one forker per launch, on the workers' own command line, and
the forker imports the worker's code once and forks each worker from itself on request. A forked
worker is what `python -m train worker` would be: the same command line (so `ps` and `pgrep`
show it as before) and environment, plus its TF_CONFIG and attempt, started in milliseconds.

Forking after the import is safe because importing starts nothing a worker shares: TensorFlow
makes its thread pools, gRPC server and eager context when a worker first uses it, after the
fork, and the only threads the import starts are numpy's OpenBLAS servers, parked, which
OpenBLAS itself restarts in a forked child.

`ps -o comm` tells the forker from its workers: it is named train-forker. A forked worker's
/proc/<pid>/environ shows what the forker started with, not its own TF_CONFIG; its log's first
lines name the worker.
`TRAIN_FORK_WORKERS=0` starts every worker as a process of its own instead.

The launcher and the forker speak one JSON object per line. To the forker, on its stdin:
`{"start": index, "env": {...}, "log": path}` and `{"signal": index, "number": n}`. From it, on
its stdout: `{"exited": index, "code": code}`, the code as `subprocess.Popen.returncode` has it
(negative: killed by that signal). When its stdin closes, the forker kills any worker it still
has and exits; when the forker dies, its workers die with it (a parent-death signal).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

from contract import processes, spawn

ENABLE_ENV = "TRAIN_FORK_WORKERS"  # "0": one process of its own per worker
ROLE_ENV = "TRAIN_WORKER_FORKER"  # set on the forker's own process only
# The launcher's process group, for a fault that kills the whole stage (train.callbacks): a
# forker forked by the fork server leads a group of its own, apart from the launcher's.
STAGE_GROUP_ENV = "TRAIN_STAGE_GROUP"
NAME = b"train-forker"
REAP_SECONDS = 0.1
PR_SET_NAME, PR_GET_NAME = 15, 16  # <linux/prctl.h>


def enabled() -> bool:
    """Whether local workers are forked: on Linux (fork after importing TensorFlow is not safe on
    macOS), unless TRAIN_FORK_WORKERS=0."""
    return sys.platform == "linux" and os.environ.get(ENABLE_ENV, "1") != "0"


def is_forker() -> bool:
    """Whether this process was started as a forker (and not yet forked into a worker)."""
    return os.environ.get(ROLE_ENV) == "1"


# The forker's side.


def serve() -> None:
    """Imports the worker's code, then starts and signals workers as the launcher asks.

    Exits when the launcher closes stdin; returns only in a forked worker, which then runs as
    `python -m train worker` would.
    """
    os.environ.pop(ROLE_ENV, None)
    import tensorflow  # noqa: F401
    import tf_keras  # noqa: F401

    import train.worker  # noqa: F401

    # What the imports made lives as long as every worker: out of the collector's sight, a
    # worker's collections neither walk it nor write to its pages (which a fork shares).
    gc.freeze()
    worker_name = _name()
    _set_name(NAME)
    arm = processes.signal_when_parent_dies(signal.SIGKILL)
    children: dict[int, int] = {}  # pid -> worker index
    pending = b""
    while True:
        _reap(children)
        ready, _, _ = select.select([0], [], [], REAP_SECONDS)
        if not ready:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            _kill_all(children)
            os._exit(0)
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            command = json.loads(line)
            if "signal" in command:
                for pid, index in children.items():
                    if index == command["signal"]:
                        os.kill(pid, command["number"])
                continue
            pid = os.fork()
            if pid == 0:
                _become_worker(command["env"], command["log"], arm, worker_name)
                return
            children[pid] = command["start"]


def _become_worker(env: dict[str, str], log: str, arm: Callable[[], None], name: bytes) -> None:
    arm()
    _set_name(name)
    os.environ.update(env)
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.close(devnull)
    # A fresh process would draw its own seed; Python's `random` reseeds itself after a fork.
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _reap(children: dict[int, int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        index = children.pop(pid, None)
        if index is not None:
            _reply({"exited": index, "code": os.waitstatus_to_exitcode(status)})


def _kill_all(children: dict[int, int]) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in children:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _reply(message: dict) -> None:
    with contextlib.suppress(BrokenPipeError):
        os.write(1, (json.dumps(message) + "\n").encode())


def _name() -> bytes:
    buffer = ctypes.create_string_buffer(16)
    prctl = processes.libc_prctl()
    if prctl is not None:
        prctl(PR_GET_NAME, buffer)
    return buffer.value


def _set_name(name: bytes) -> None:
    prctl = processes.libc_prctl()
    if prctl is not None and name:
        prctl(PR_SET_NAME, ctypes.c_char_p(name[:15]))


# The launcher's side.


class Forker:
    """The launcher's end of one forker: starts, signals and reaps the workers it forks.

    The forker is itself forked from the warm fork server when one serves (contract.spawn).
    It dies with the launcher (a parent-death SIGKILL), and its workers with it.

    Args:
        argv: the workers' command line, which the forker runs with and its workers inherit.
        env: the environment every worker shares.
        pass_fds: descriptors the forker and its workers keep (the date's lock).
        stderr_path: where the forker's own errors go (the chief's log).
        namespaces: (descriptor, kind) pairs the forker joins first (the private network).
    """

    def __init__(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        pass_fds: Sequence[int],
        stderr_path: str,
        namespaces: Sequence[tuple[int, int]] = (),
    ) -> None:
        self._codes: dict[int, int | None] = {}
        self._changed = threading.Condition()
        self._writing = threading.Lock()  # the launcher stops its workers from several threads
        self.gone = False
        with open(stderr_path, "ab") as stderr:
            self._process = spawn.popen(
                list(argv),
                env={**env, ROLE_ENV: "1", STAGE_GROUP_ENV: str(os.getpgid(0))},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                death_signal=signal.SIGKILL,
                namespaces=namespaces,
                pass_fds=tuple(pass_fds),
            )
        self._reader = threading.Thread(target=self._read, name="forker-replies", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            message = json.loads(line)
            with self._changed:
                self._codes[message["exited"]] = message["code"]
                self._changed.notify_all()
        # The forker is gone, and its workers with it: each was sent SIGKILL when it died.
        code = self._process.wait()
        with self._changed:
            self.gone = True
            for index, running in self._codes.items():
                if running is None:
                    self._codes[index] = code if code > 0 else -signal.SIGKILL
            self._changed.notify_all()

    def _send(self, message: dict) -> None:
        assert self._process.stdin is not None
        # A forker that died is reported by the reader, with its workers' codes.
        with self._writing, contextlib.suppress(BrokenPipeError, ValueError):
            self._process.stdin.write((json.dumps(message) + "\n").encode())
            self._process.stdin.flush()

    def start(self, index: int, env: dict[str, str], log_path: str) -> None:
        with self._changed:
            self._codes[index] = None if not self.gone else -signal.SIGKILL
        self._send({"start": index, "env": env, "log": log_path})

    def poll(self, index: int) -> int | None:
        with self._changed:
            return self._codes.get(index)

    def signal(self, index: int, number: int) -> None:
        self._send({"signal": index, "number": int(number)})

    def wait(self, index: int, timeout: float | None = None) -> int | None:
        """Waits up to `timeout` seconds (None: as long as it takes) for worker `index` to end."""
        with self._changed:
            self._changed.wait_for(lambda: self._codes.get(index) is not None, timeout)
            return self._codes.get(index)

    def close(self) -> None:
        """Closes the forker's stdin (it kills any worker left) and waits for it to exit."""
        if self._process.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self._process.stdin.close()
        try:
            self._process.wait(30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join()
