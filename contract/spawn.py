"""Starts a program: forked from the warm fork server when one serves, else a process of its own.

`popen(argv, ...)` is `subprocess.Popen` for the programs the pipeline starts (a stage, the
train launcher's worker forker). When the `PIPELINE_FORKSERVER` environment variable names
a fork server's socket (contract.forkserver) and the server agrees that it can run the
command exactly as a fresh process would, the program is forked from it with TensorFlow and
Beam already imported; otherwise it is started as before. Either way the caller gets an object
with Popen's `pid`, `stdin`, `stdout`, `poll`, `wait`, `send_signal`, `kill` and `returncode`.

`run(argv, ...)` is `subprocess.run` with its output captured, for a program `popen` starts.

`serving(folder)` starts a fork server for a run of many programs (a simulation, a test
session) and yields the environment that sends them to it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any

from contract import processes
from contract.forkserver import ENV, MAX_MESSAGE

START_SECONDS = 120
_usage_lock = threading.Lock()
_usage = {"cpu": 0.0, "maxrss": 0}


def forked_usage() -> tuple[float, int]:
    """CPU-seconds and the largest peak RSS (KiB) of the programs this process had forked by
    the fork server, ended so far: what `RUSAGE_CHILDREN` would have counted for them."""
    with _usage_lock:
        return float(_usage["cpu"]), int(_usage["maxrss"])


class Forked:
    """A program the fork server forked for this process: Popen's interface to it."""

    def __init__(
        self,
        args: Sequence[str],
        conn: socket.socket,
        pid: int,
        stdin: IO[bytes] | None,
        stdout: IO[bytes] | None,
    ) -> None:
        self.args = list(args)
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = None
        self.returncode: int | None = None
        self._conn = conn
        self._lock = threading.Lock()

    def _check(self, timeout: float | None) -> bool:
        """Whether the program has ended, waiting up to `timeout` seconds to hear so."""
        if self.returncode is not None:
            return True
        with contextlib.suppress(ValueError, OSError):  # closed by another thread
            if not select.select([self._conn], [], [], timeout)[0]:
                return False
        with self._lock:
            if self.returncode is None:
                try:
                    data = self._conn.recv(MAX_MESSAGE, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    return False
                except OSError:
                    data = b""
                self._finish(data)
        return True

    def _finish(self, data: bytes) -> None:
        if not data:  # the server died, and took its programs with it
            self.returncode = -signal.SIGKILL
        else:
            reply = json.loads(data)
            self.returncode = int(reply["exit"])
            with _usage_lock:
                _usage["cpu"] += float(reply.get("cpu", 0.0))
                _usage["maxrss"] = max(int(_usage["maxrss"]), int(reply.get("maxrss", 0)))
        self._conn.close()

    def poll(self) -> int | None:
        self._check(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._check(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


Process = subprocess.Popen[bytes] | Forked


def popen(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stdin: int | IO[Any] | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    start_new_session: bool = False,
    pass_fds: Sequence[int] = (),
    death_signal: signal.Signals | None = None,
    namespaces: Sequence[tuple[int, int]] = (),
    cwd: str | None = None,
) -> Process:
    """Starts `argv` as `subprocess.Popen` would, through the fork server when one can run it.

    Args:
        argv: the command line.
        env: its environment (this process's when None); its `PIPELINE_FORKSERVER` decides.
        stdin, stdout, stderr: as for Popen: PIPE, DEVNULL, STDOUT (stderr), a file or
            descriptor, or None (this process's).
        start_new_session: the program leads a session (and process group) of its own. One
            the fork server forks always does: it cannot join this process's group.
        pass_fds: descriptors it keeps, at the same numbers.
        death_signal: sent to it when this process dies (None: nothing).
        namespaces: (descriptor, kind) pairs it joins with setns before it runs.
        cwd: the folder it runs in (this process's when None).
    """
    env = dict(os.environ if env is None else env)
    path = env.get(ENV)
    if path and sys.platform == "linux" and list(argv[1:2]) == ["-m"]:
        forked = _fork(
            argv,
            env,
            stdin,
            stdout,
            stderr,
            start_new_session,
            pass_fds,
            death_signal,
            namespaces,
            path,
            os.path.abspath(cwd) if cwd else os.getcwd(),
        )
        if forked is not None:
            return forked
    return subprocess.Popen(
        list(argv),
        env=env,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=start_new_session,
        pass_fds=tuple(pass_fds),
        preexec_fn=_preexec(death_signal, namespaces),
        cwd=cwd,
    )


def run(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    *,
    timeout: float | None = None,
    start_new_session: bool = False,
    cwd: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(argv, capture_output=True, text=True)` for a program `popen` starts
    (forked when a fork server serves): its exit code, stdout and stderr once it ends.

    Raises:
        subprocess.TimeoutExpired: it ran past `timeout` seconds (it is killed first).
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = popen(
            argv, env=env, stdout=out, stderr=err, start_new_session=start_new_session, cwd=cwd
        )
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        out.seek(0)
        err.seek(0)
        stdout, stderr = (f.read().decode(errors="replace") for f in (out, err))
    return subprocess.CompletedProcess(list(argv), code, stdout, stderr)


def _preexec(
    death_signal: signal.Signals | None, namespaces: Sequence[tuple[int, int]]
) -> Callable[[], None] | None:
    arm = processes.signal_when_parent_dies(death_signal) if death_signal else None
    setns = ctypes.CDLL(None, use_errno=True).setns if namespaces else None
    if arm is None and setns is None:
        return None

    def run() -> None:
        if arm is not None:
            arm()
        for fd, kind in namespaces:
            assert setns is not None
            if setns(fd, kind) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"setns: {os.strerror(code)}")

    return run


def _fork(
    argv: Sequence[str],
    env: dict[str, str],
    stdin: int | IO[Any] | None,
    stdout: int | IO[Any] | None,
    stderr: int | IO[Any] | None,
    start_new_session: bool,
    pass_fds: Sequence[int],
    death_signal: signal.Signals | None,
    namespaces: Sequence[tuple[int, int]],
    path: str,
    cwd: str,
) -> Forked | None:
    """The program forked by the server at `path`; None when it cannot or will not."""
    ours: list[int] = []  # the parent's ends of pipes
    theirs: list[int] = []  # what the program gets, closed here once sent
    opened: list[int] = []
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(path)
    except OSError:
        return None  # no server there: a process of its own
    try:
        child_in, parent_in = _stream(stdin, 0, reading=True, ours=ours, opened=opened)
        child_out, parent_out = _stream(stdout, 1, reading=False, ours=ours, opened=opened)
        if stderr == subprocess.STDOUT:
            child_err = child_out
        else:
            child_err, _ = _stream(stderr, 2, reading=False, ours=ours, opened=opened)
        theirs = [child_in, child_out, child_err, *pass_fds, *(fd for fd, _ in namespaces)]
        targets = [0, 1, 2, *pass_fds]
        request = {
            "argv": list(argv),
            "env": env,
            "cwd": cwd,
            "targets": targets + [-1] * len(namespaces),
            "namespaces": [[len(targets) + i, kind] for i, (_, kind) in enumerate(namespaces)],
            "death_signal": int(death_signal or 0),
        }
        socket.send_fds(conn, [json.dumps(request).encode()], theirs)
        reply = json.loads(conn.recv(MAX_MESSAGE) or b'{"refused": "the server closed"}')
    except (OSError, ValueError):
        reply = {"refused": "no reply"}
    finally:
        for fd in opened:
            os.close(fd)
    if "pid" not in reply:
        conn.close()
        for fd in ours:
            os.close(fd)
        return None
    return Forked(
        argv,
        conn,
        int(reply["pid"]),
        os.fdopen(parent_in, "wb") if parent_in is not None else None,
        os.fdopen(parent_out, "rb") if parent_out is not None else None,
    )


def _stream(
    spec: int | IO[Any] | None, default: int, *, reading: bool, ours: list[int], opened: list[int]
) -> tuple[int, int | None]:
    """(the program's descriptor, the parent's pipe end or None) for one standard stream."""
    if spec is None:
        return default, None
    if spec == subprocess.PIPE:
        read_end, write_end = os.pipe()
        child, parent = (read_end, write_end) if reading else (write_end, read_end)
        ours.append(parent)
        opened.append(child)
        return child, parent
    if spec == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDONLY if reading else os.O_WRONLY)
        opened.append(fd)
        return fd, None
    if isinstance(spec, int):
        return spec, None
    return spec.fileno(), None


@contextlib.contextmanager
def serving(
    folder: str, env: Mapping[str, str] | None = None, preload: Sequence[str] | None = None
) -> Iterator[dict[str, str]]:
    """Runs a fork server (its socket in `folder`) while the block runs.

    `preload` names the modules it imports before serving (None: TensorFlow, tf_keras, Beam
    and the stages' heaviest modules).

    Yields:
        `env` (this process's environment when None) with `PIPELINE_FORKSERVER` set: the
        environment of programs that should go through the server. The server starts with
        `env`, so what they read at import matches it.

    Raises:
        RuntimeError: the server did not start; its error output says why.
    """
    env = dict(os.environ if env is None else env)
    path = os.path.join(folder, "forkserver.sock")
    server = subprocess.Popen(
        [sys.executable, "-m", "contract.forkserver", "--socket", path]
        + ([] if preload is None else ["--preload", ",".join(preload)]),
        env={**env, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        preexec_fn=processes.signal_when_parent_dies(signal.SIGTERM),
    )
    assert server.stdout is not None and server.stdin is not None
    try:
        ready, _, _ = select.select([server.stdout], [], [], START_SECONDS)
        if not ready or server.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"the fork server did not start (exit {server.poll()})")
        yield {**env, ENV: path}
    finally:
        with contextlib.suppress(OSError):
            server.stdin.close()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


@contextlib.contextmanager
def serving_this_process() -> Iterator[str]:
    """Runs a fork server for every program this process starts while the block runs: sets
    `PIPELINE_FORKSERVER` in this process's environment, then takes it away again.

    Yields:
        The server's socket, in a new temporary folder (short: a socket path has 107 bytes).
    """
    folder = tempfile.mkdtemp(prefix="forkserver-")
    try:
        with serving(folder) as env:
            os.environ[ENV] = env[ENV]
            try:
                yield env[ENV]
            finally:
                os.environ.pop(ENV, None)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
