"""A private network for one local training cluster: a network namespace with only loopback up.

TensorFlow's gRPC server listens on every interface whatever TF_CONFIG says, with no
authentication. The local launcher therefore starts its workers inside one network namespace
of their own (Linux), where loopback is the only interface: the workers reach each other on
127.0.0.1 and nothing outside the namespace can reach them, the host's own loopback included.

A holder process made by `unshare --user --map-root-user --net` keeps the namespace alive
and brings loopback up; each worker joins it between fork and exec (`setns`, as
`nsenter --net=/proc/PID/ns/net --preserve-credentials` would). A user namespace comes with
it, so an unprivileged user can make one wherever the kernel allows user namespaces; root
joins the network namespace only and keeps its credentials.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable

from contract import processes

CLONE_NEWNET = 0x40000000  # <linux/sched.h>
CLONE_NEWUSER = 0x10000000
READY = b"ready\n"
START_SECONDS = 20.0

# Runs inside the new namespaces: brings loopback up (SIOCGIFFLAGS, SIOCSIFFLAGS | IFF_UP),
# says it is ready, then lives until the launcher closes its stdin (or dies).
_HOLDER = """
import fcntl, socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sH14s", fcntl.ioctl(s, 0x8913, struct.pack("16sH14s", b"lo", 0, b"")))[1]
fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", flags | 1, b""))
s.close()
sys.stdout.write("ready\\n")
sys.stdout.flush()
sys.stdin.read()
"""


class NamespaceUnavailable(RuntimeError):
    """This machine cannot make the namespace (no unshare, user namespaces disabled, ...)."""


class PrivateNetwork:
    """A network namespace held open by a holder process; workers join it through `enter`."""

    def __init__(self, holder: subprocess.Popen[bytes]) -> None:
        self.holder = holder
        self.join_user = os.geteuid() != 0  # root may join the network namespace directly
        self._fds: list[tuple[int, int]] = []
        try:
            if self.join_user:
                user = os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY)
                self._fds.append((user, CLONE_NEWUSER))
            net = os.open(f"/proc/{holder.pid}/ns/net", os.O_RDONLY)
            self._fds.append((net, CLONE_NEWNET))
        except OSError as e:
            self.close()
            raise NamespaceUnavailable(
                f"cannot open the namespace of pid {holder.pid}: {e}"
            ) from None
        self._setns = ctypes.CDLL(None, use_errno=True).setns

    @classmethod
    def create(cls) -> PrivateNetwork:
        """Makes the namespace and brings its loopback up.

        Raises:
            NamespaceUnavailable: with the reason, when the namespace cannot be made here.
        """
        argv = ["unshare", "--user", "--map-root-user", "--net", sys.executable, "-c", _HOLDER]
        try:
            holder = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                preexec_fn=processes.signal_when_parent_dies(signal.SIGKILL),
            )
        except OSError as e:
            raise NamespaceUnavailable(f"cannot run unshare: {e}") from None
        assert holder.stdout is not None and holder.stderr is not None
        line = _read_line(holder, START_SECONDS)
        if line != READY:
            _stop(holder)
            detail = holder.stderr.read().decode(errors="replace").strip().splitlines()
            raise NamespaceUnavailable(
                f"unshare --user --net failed: {detail[-1] if detail else 'no reason given'}"
            )
        return cls(holder)

    def enter(self) -> None:
        """Moves the calling process into the namespace; run it between fork and exec.

        Raises:
            OSError: setns refused (then the worker does not start rather than run exposed).
        """
        for fd, kind in self._fds:
            if self._setns(fd, kind) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"setns into the workers' network: {os.strerror(code)}")

    @property
    def namespaces(self) -> tuple[tuple[int, int], ...]:
        """The (descriptor, kind) pairs to join, in order: for a program started elsewhere."""
        return tuple(self._fds)

    def preexec(self, first: Callable[[], None]) -> Callable[[], None]:
        """A `preexec_fn` that runs `first`, then joins the namespace."""

        def run() -> None:
            first()
            self.enter()

        return run

    @property
    def holder_pid(self) -> int:
        return self.holder.pid

    def close(self) -> None:
        """Ends the holder; the namespace goes when its last worker has exited too."""
        for fd, _ in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []
        _stop(self.holder)


def _read_line(holder: subprocess.Popen[bytes], timeout: float) -> bytes:
    """The holder's first line, or b"" if it exits or stays silent for `timeout` seconds."""
    import selectors

    assert holder.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(holder.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            return b""
    return holder.stdout.readline()


def _stop(holder: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        if holder.stdin is not None:
            holder.stdin.close()
    try:
        holder.wait(5)
    except subprocess.TimeoutExpired:
        holder.kill()
        holder.wait()
