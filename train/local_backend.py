"""Workers as local processes on loopback ports, inside a private network namespace.

The workers are forked from one process that imported their code (train.forker), or each
started on its own; every one runs in the cluster's own network namespace
(train.private_network), where its gRPC server, which listens on every interface without
authentication, is reachable from the cluster only. Where that cannot be, the launch stops
unless `allow_host_network` lets the workers keep the host's network.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import subprocess
from collections.abc import Callable

from contract import processes, run_lock, storage
from train import cluster, forker, restarts
from train.config import ConfigError, TrainConfig
from train.private_network import NamespaceUnavailable, PrivateNetwork

logger = logging.getLogger("train.launcher")

LOOPBACK = "127.0.0.1"
# Where the kernel reads the range it draws every outgoing connection's local port from.
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
# The workers' ports are picked from this many ports just below that range: a port picked
# inside it could be taken by any connection between the pick and the worker's bind.
LISTEN_SPAN = 8192


class _OwnProcesses:
    """Each worker a process of the launcher's own: `forker.Forker`'s interface without the
    forker (TRAIN_FORK_WORKERS=0, or off Linux)."""

    gone = False  # nothing to outlive

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        preexec: Callable[[], None],
        pass_fds: tuple[int, ...],
    ) -> None:
        self.argv, self.env, self.preexec, self.pass_fds = argv, env, preexec, pass_fds
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, index: int, env: dict[str, str], log_path: str) -> None:
        with open(log_path, "ab") as log_file:
            self.processes[index] = subprocess.Popen(
                self.argv,
                env={**self.env, **env},
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=self.preexec,
                pass_fds=self.pass_fds,
            )

    def poll(self, index: int) -> int | None:
        process = self.processes.get(index)
        return process.poll() if process else None

    def signal(self, index: int, number: int) -> None:
        process = self.processes.get(index)
        if process is not None and process.poll() is None:
            process.send_signal(number)

    def wait(self, index: int, timeout: float | None = None) -> int | None:
        try:
            return self.processes[index].wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        pass


class LocalProcessBackend:
    """Workers as local processes on loopback ports, each logging to its own file.

    With a `network`, every worker runs inside that private network namespace, where its
    gRPC server (which listens on every interface) is reachable from the cluster only.
    """

    def __init__(
        self,
        worker_argv: list[str],
        log_dir: str,
        ports: list[int] | None = None,
        network: PrivateNetwork | None = None,
    ):
        self.worker_argv = worker_argv
        self.log_dir = log_dir
        self.ports = ports
        self.network = network
        # Forked from one process that imported the worker's code (train.forker), or each
        # started on its own; made at the first start, and again after a forker died.
        self.workers: forker.Forker | _OwnProcesses | None = None

    def addresses(self, num_workers: int) -> list[str]:
        if self.ports is None:
            return [f"{LOOPBACK}:{port}" for port in free_ports(num_workers)]
        if len(self.ports) != num_workers:
            raise restarts.LaunchError(
                f"--ports lists {len(self.ports)} ports for {num_workers} workers"
            )
        for port in self.ports:
            check_port_free(port)
        return [f"{LOOPBACK}:{port}" for port in self.ports]

    def log_path(self, worker_index: int) -> str:
        return os.path.join(self.log_dir, f"worker-{worker_index}.log")

    def _new_workers(self) -> forker.Forker | _OwnProcesses:
        env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "PYTHONUNBUFFERED": "1"}
        # A worker outliving a SIGKILLed launcher would hold its port, blocking a rerun.
        preexec = processes.signal_when_parent_dies(signal.SIGKILL)
        if self.network is not None:
            preexec = self.network.preexec(preexec)
        held = run_lock.held_fds()  # the date stays locked until every worker is gone
        if forker.enabled():
            namespaces = self.network.namespaces if self.network is not None else ()
            return forker.Forker(self.worker_argv, env, held, self.log_path(0), namespaces)
        return _OwnProcesses(self.worker_argv, env, preexec, held)

    def start(self, worker_index: int, tf_config_json: str, attempt: int) -> None:
        os.makedirs(self.log_dir, exist_ok=True)
        log_path = self.log_path(worker_index)
        with open(log_path, "ab") as log_file:
            log_file.write(f"=== attempt {attempt} worker {worker_index} ===\n".encode())
        if self.workers is None or self.workers.gone:
            self.workers = self._new_workers()
        own_env = {cluster.TF_CONFIG_ENV: tf_config_json, cluster.ATTEMPT_ENV: str(attempt)}
        self.workers.start(worker_index, own_env, log_path)

    def poll(self, worker_index: int) -> int | None:
        return self.workers.poll(worker_index) if self.workers else None

    def terminate(self, worker_index: int, grace_seconds: float) -> None:
        workers = self.workers
        if workers is None or workers.poll(worker_index) is not None:
            return
        if grace_seconds > 0:
            workers.signal(worker_index, signal.SIGTERM)
            if workers.wait(worker_index, grace_seconds) is not None:
                return
        workers.signal(worker_index, signal.SIGKILL)
        workers.wait(worker_index)

    def close(self) -> None:
        """Ends the forker and the private network's holder; each worker dies with the launcher
        anyway."""
        if self.workers is not None:
            self.workers.close()
            self.workers = None
        if self.network is not None:
            self.network.close()
            self.network = None


HOST_NETWORK_WAY_OUT = (
    "pass --allow-host-network (luigi: --Train-allow-host-network) to train on the host's "
    "network, its gRPC ports (no authentication) open on every interface while it trains"
)


def private_network_for(config: TrainConfig) -> PrivateNetwork | None:
    """The private network namespace for a local cluster; None (with a warning) only where
    `allow_host_network` lets the workers keep the host's network.

    Isolation fails closed: where the namespace cannot be made, or cannot reach the data (its
    only interface is its own loopback, so a gs:// store, and an emulator on the host's
    loopback, are out of reach from it), the run stops with the reason unless
    `allow_host_network` is set, which config.json records.

    Raises:
        ConfigError: the workers cannot be isolated and `allow_host_network` is not set.
    """
    remote = [path for path in (config.data_dir, config.train_dir) if storage.is_remote(path)]
    exposed = (
        "the workers' gRPC ports (no authentication) listen on every interface of this host "
        "while they train: keep them closed to other hosts with a firewall"
    )
    if remote:
        if not config.allow_host_network:
            raise ConfigError(
                f"the workers' private network namespace has only its own loopback and cannot "
                f"reach {' and '.join(remote)}: {HOST_NETWORK_WAY_OUT}"
            )
        logger.warning(
            "workers keep the host's network to reach %s: %s", " and ".join(remote), exposed
        )
        return None
    try:
        network = PrivateNetwork.create()
    except NamespaceUnavailable as e:
        if not config.allow_host_network:
            raise ConfigError(
                f"no private network namespace for the workers ({e}): {HOST_NETWORK_WAY_OUT}"
            ) from None
        logger.warning("no private network namespace for the workers (%s): %s", e, exposed)
        return None
    logger.info("workers run in a private network namespace (holder pid %d)", network.holder_pid)
    return network


def free_ports(count: int) -> list[int]:
    """`count` different loopback ports that can be bound now, below the kernel's ephemeral
    range where one can be found (held open together so they differ)."""
    low = ephemeral_range_start()
    candidates = list(range(max(1024, low - LISTEN_SPAN), low))
    random.shuffle(candidates)
    sockets: list[socket.socket] = []
    try:
        for port in candidates:
            if len(sockets) == count:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                s.close()
                continue
            sockets.append(s)
        while len(sockets) < count:  # none left below the range: let the kernel pick
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(s)
            s.bind((LOOPBACK, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def ephemeral_range_start(path: str = EPHEMERAL_RANGE_FILE) -> int:
    """The first port of the kernel's ephemeral range (Linux's default where it cannot be read)."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def check_port_free(port: int) -> None:
    """Raises restarts.LaunchError when `port` cannot be bound on loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            raise restarts.LaunchError(
                f"port {port} on {LOOPBACK} is in use: free it, or leave out --ports to pick "
                "free ports"
            ) from None
