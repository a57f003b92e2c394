"""A warm fork server: one process imports TensorFlow and Beam once and forks stage programs.

A stage program (`python -m preprocess run ...`, `python -m evaluate ...`, the train
launcher's worker forker) spends about 5 CPU-seconds importing TensorFlow (and 1.5 more for
Beam) before it does anything. A night of a small model, and a run of many nights (a
simulation, a catch-up, a test suite), pays that in every stage. A fork server imports them
once; a program it forks starts with them loaded, in milliseconds.

`python -m contract.forkserver --socket PATH` serves on a Unix socket until its stdin closes
(or its parent dies). Programs started through `contract.spawn.popen` go through it when the
`PIPELINE_FORKSERVER` environment variable names its socket; without it, or for any command
it cannot run exactly as a fresh process would, they start as processes of their own.

A forked program is what `python -m <module> <args>` would be: the same interpreter, its own
argv, environment and working directory, standard streams and kept descriptors (passed over
the socket), and its exit code and CPU-seconds reported back. It
differs in four ways, each covered where it matters:
- its parent is this server, so the caller's parent-death signal is sent by the server when
  the caller's connection closes (the caller died or gave up), not by the kernel;
- it always leads a session (and process group) of its own, never the caller's group;
- `ps` shows the server's command line; `/proc/<pid>/comm` is the module's name;
- environment variables that TensorFlow (its gs:// file system's `GCS_*` settings too), Keras,
  CUDA, OpenMP or Python read at import must be what the server started with: a request that
  differs in any of them is refused, and the caller starts the program as a process of its own
  instead.

Forking after the import is safe for the same reason as train.forker's: importing starts no
thread a program shares (TensorFlow makes its pools, gRPC server and eager context at first
use, after the fork; OpenBLAS restarts its parked servers in a forked child).

One request per connection, as one SOCK_SEQPACKET message: a JSON object with the program's
`argv`, `env`, `cwd`, `targets` (the descriptor numbers the
passed descriptors take, in order), `namespaces` (indexes into the passed descriptors and
their setns kind) and `death_signal`. Replies: `{"pid": n}` then `{"exit": code, "cpu": s,
"maxrss": kb}`, or `{"refused": reason}`.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import fcntl
import gc
import importlib
import importlib.util
import json
import logging
import os
import runpy
import select
import signal
import socket
import sys
import threading
import traceback
from typing import Any

from contract import processes

ENV = "PIPELINE_FORKSERVER"
# What the server imports before it serves: what makes a stage slow to start.
DEFAULT_PRELOAD = (
    "tensorflow",
    "tf_keras",
    "apache_beam",
    "apache_beam.runners.direct.direct_runner",
    "apache_beam.runners.portability.fn_api_runner",
    # Preprocess checks its Beam flags against every runner's, the Dask runner's too.
    "apache_beam.runners.dask.dask_runner",
    # The histogram and scalar summaries of a worker's TensorBoard callback.
    "tensorboard.summary.v1",
    "preprocess.pipeline",
    "train.worker",
    "evaluate.stage",
)
# Read at import by TensorFlow, Keras, CUDA, OpenMP/MKL, gRPC or Python itself: a request
# must carry the server's values. TensorFlow makes its gs:// file system, which reads the
# GCS_* settings (its caches, its read buffer), when it is imported.
IMPORT_TIME_PREFIXES = (
    "TF_", "KERAS", "CUDA", "OMP_", "MKL", "XLA_", "GRPC_", "GCS_", "PYTHON", "LD_",
)  # fmt: skip
# PYTHONPATH is checked on its own: its folders must not hold another copy of a loaded module.
RUNTIME_ONLY = frozenset({"PYTHONUNBUFFERED", "TF_CONFIG", "PYTHONFAULTHANDLER", "PYTHONPATH"})
MAX_MESSAGE = 1 << 20
MAX_FDS = 64
PR_SET_NAME = 15
REAP_SECONDS = 0.5


def import_time_env(env: dict[str, str]) -> dict[str, str]:
    """The variables of `env` that a module may read when it is imported."""
    return {
        key: value
        for key, value in env.items()
        if key.startswith(IMPORT_TIME_PREFIXES) and key not in RUNTIME_ONLY
    }


class _Server:
    def __init__(self, path: str, before_imports: dict[str, str]) -> None:
        self.import_env = import_time_env(before_imports)
        # sys.path without the folders `python -m` and PYTHONPATH put first.
        pythonpath = before_imports.get("PYTHONPATH", "").split(os.pathsep)
        self.site_path = [entry for entry in sys.path[1:] if entry not in pythonpath]
        self.set_by_imports = {
            key: value for key, value in os.environ.items() if before_imports.get(key) != value
        }
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.listener.bind(path)
        self.listener.listen(64)
        # pid -> its caller's connection (None once the caller is gone)
        self.children: dict[int, socket.socket | None] = {}
        self.death_signals: dict[int, int] = {}
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_write, False)
        signal.set_wakeup_fd(self.wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def serve(self) -> None:
        while True:
            callers = [conn for conn in self.children.values() if conn is not None]
            watched: list[int | socket.socket] = [0, self.listener, self.wake_read, *callers]
            ready, _, _ = select.select(watched, [], [], REAP_SECONDS)
            for item in ready:
                if item == 0:
                    if not os.read(0, 1 << 16):
                        self._stop()
                        return
                elif item is self.listener:
                    conn, _ = self.listener.accept()
                    if self._handle(conn):
                        return  # in the forked child: run the program
                elif item == self.wake_read:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_read, 1024)
                elif isinstance(item, socket.socket):
                    self._caller_gone(item)
            self._reap()

    def _handle(self, conn: socket.socket) -> bool:
        """Forks the program `conn` asks for; True in the child."""
        fds: list[int] = []
        try:
            data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, MAX_FDS)
            request = json.loads(data)
            refusal = self._refusal(request, len(fds))
            if refusal:
                _send(conn, {"refused": refusal})
                conn.close()
                return False
            sys.stdout.flush()
            sys.stderr.flush()
            started_read, started_write = os.pipe()
            pid = os.fork()
        except (OSError, ValueError) as e:
            with contextlib.suppress(OSError):
                _send(conn, {"refused": f"fork server: {e}"})
            conn.close()
            for fd in fds:
                os.close(fd)
            return False
        if pid == 0:
            os.close(started_read)
            self._become(request, fds, conn)
            os.close(started_write)  # set up: its session and descriptors are in place
            return True
        os.close(started_write)
        for fd in fds:
            os.close(fd)
        os.read(started_read, 1)  # as Popen returns only once the child has exec'd
        os.close(started_read)
        self.children[pid] = conn
        self.death_signals[pid] = int(request.get("death_signal") or 0)
        _send(conn, {"pid": pid})
        return False

    def _refusal(self, request: dict[str, Any], passed: int) -> str:
        argv = request["argv"]
        if len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m":
            return "only `<this python> -m <module> ...` is forked"
        if import_time_env(request["env"]) != self.import_env:
            return "the environment read at import differs from the fork server's"
        if len(request["targets"]) != passed:
            return "descriptors and their numbers do not match"
        for folder in _path_before_site(request):
            # `python -m` puts these first on sys.path: their own copy of a module this server
            # has loaded would have been imported instead.
            for entry in os.listdir(folder) if os.path.isdir(folder) else ():
                name = entry.removesuffix(".py")
                loaded = getattr(sys.modules.get(name), "__file__", None)
                real, here = os.path.realpath(loaded or ""), os.path.realpath(folder + "/" + entry)
                if loaded and real != here and not real.startswith(here + os.sep):
                    return f"{folder} has its own {name}"
        return ""

    def _become(self, request: dict[str, Any], fds: list[int], conn: socket.socket) -> None:
        """In the child: takes the program's descriptors, environment and name."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        conn.close()
        self.listener.close()
        for caller in self.children.values():
            if caller is not None:
                caller.close()
        os.close(self.wake_read)
        os.close(self.wake_write)
        # Always a session of its own: the caller's process group lies in another session,
        # which it cannot join, and in the server's it would share group-wide signals with
        # whoever started the server. The caller's group-wide end reaches it as its
        # parent-death signal instead.
        os.setsid()
        setns = ctypes.CDLL(None, use_errno=True).setns
        for index, kind in request.get("namespaces", []):
            if setns(fds[index], kind) != 0:
                code = ctypes.get_errno()
                os.write(fds[2], f"error: setns: {os.strerror(code)}\n".encode())
                os._exit(1)
        # Moved above every target first: a passed descriptor may sit on another's number.
        targets = request["targets"]
        above = max([*targets, *fds, 2]) + 1
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, above) for fd in fds]
        for fd in fds:
            os.close(fd)
        for fd, target in zip(high, targets, strict=True):
            if target >= 0:
                os.dup2(fd, target)  # inheritable, as Popen's pass_fds are
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        for key, value in self.set_by_imports.items():  # as the imports would set them again
            os.environ.setdefault(key, value)
        os.chdir(request["cwd"])
        sys.argv = [request["argv"][0], *request["argv"][3:]]
        first = _path_before_site(request)
        sys.path[:] = first + [entry for entry in self.site_path if entry not in first]
        module = request["argv"][2]
        name = module.removesuffix(".__main__").rsplit(".", 1)[-1]
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]))
        # A fresh process draws its own seeds; Python's `random` reseeds itself after a fork.
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self.module = module

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            self.death_signals.pop(pid, None)
            if conn is None:
                continue
            with contextlib.suppress(OSError):
                _send(
                    conn,
                    {
                        "exit": os.waitstatus_to_exitcode(status),
                        "cpu": usage.ru_utime + usage.ru_stime,
                        "maxrss": usage.ru_maxrss,
                    },
                )
            conn.close()

    def _caller_gone(self, conn: socket.socket) -> None:
        """A caller's connection closed before its program ended (callers send nothing after
        their request): the program's parent-death signal, as the kernel would have sent it."""
        for pid, caller in self.children.items():
            if caller is conn:
                sig = self.death_signals.get(pid, 0)
                if sig:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
                self.children[pid] = None  # still reaped, no longer watched
        conn.close()

    def _stop(self) -> None:
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.listener.close()


def _path_before_site(request: dict[str, Any]) -> list[str]:
    """The folders a fresh `python -m` would search first: its working directory, then
    PYTHONPATH's."""
    extra = request["env"].get("PYTHONPATH", "").split(os.pathsep)
    cwd = request["cwd"]
    return [cwd, *(os.path.normpath(os.path.join(cwd, entry)) for entry in extra if entry)]


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps(message).encode())


def _run_module(module: str) -> int:
    """Runs `module` as `python -m` would, then exits as the interpreter would."""
    code = 0
    try:
        loaded = sys.modules.get(module)
        if loaded is not None and not hasattr(loaded, "__path__"):
            # As `python -m` runs a module the server loaded: a fresh copy, as __main__ (a
            # package's __main__ is never loaded here, so a package stays).
            sys.modules.pop(module)
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    # What the interpreter does at its end: wait for threads, run atexit, flush.
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    return code


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m contract.forkserver", description=__doc__)
    parser.add_argument("--socket", required=True, help="the Unix socket to serve on")
    parser.add_argument(
        "--preload",
        default=",".join(DEFAULT_PRELOAD),
        help="comma-separated modules imported before serving",
    )
    args = parser.parse_args(argv)
    prctl = processes.libc_prctl()
    if prctl is not None:  # ends with whoever started it, like the programs it forks
        prctl(processes.PR_SET_PDEATHSIG, int(signal.SIGTERM))
    before_imports = dict(os.environ)  # the imports set some (TF2_BEHAVIOR, ...)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    for module in filter(None, args.preload.split(",")):
        # One not installed (Dask is optional to Beam) is imported by the program that needs
        # it, which then fails as it would without a server.
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    # A warning logged at import (Beam's) gives the root logger a handler; a program's own
    # `logging.basicConfig` would then do nothing, as it does not in a fresh process.
    root.handlers[:] = handlers
    root.setLevel(level)
    # What the imports made lives as long as every program forked from here: out of the
    # collector's sight, a program's collections neither walk it nor write to its pages.
    gc.freeze()
    server = _Server(args.socket, before_imports)
    print("ready", flush=True)
    server.serve()
    if not hasattr(server, "module"):
        os._exit(0)
    os._exit(_run_module(server.module))


if __name__ == "__main__":
    main()
