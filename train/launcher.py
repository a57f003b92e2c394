"""The launcher: starts N workers, streams the chief, restarts the cluster when one dies.

How a worker is started and stopped sits behind `WorkerBackend`: `LocalProcessBackend` (local
processes, here) or `train.docker_backend.DockerWorkerBackend` (one container per worker), picked
by `python -m train launch --backend`; the restart logic is the same for both.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Protocol

from contract import layout, manifest, processes, run_lock, settings, storage
from contract.messages import (
    ERROR_PREFIX,
    EXIT_BAD_INPUT,
    EXIT_DISK_FULL,
    EXIT_PREEMPTED,
    notice_line,
    restart_may_help,
)
from train import checks, cluster, forker, user_model
from train.config import MAX_RESTARTS, ConfigError, TrainConfig
from train.private_network import NamespaceUnavailable, PrivateNetwork

logger = logging.getLogger(__name__)

BAD_INPUT_EXIT_CODE = EXIT_BAD_INPUT  # a worker found bad input: restarting cannot help
POLL_SECONDS = 0.2
STOP_GRACE_SECONDS = 10.0
LOOPBACK = "127.0.0.1"


class LaunchError(RuntimeError):
    """Training could not start or could not finish within the allowed restarts."""


class WorkerBackend(Protocol):
    """Starts and stops worker processes wherever they run."""

    def addresses(self, num_workers: int) -> list[str]:
        """host:port of every worker, for TF_CONFIG's cluster."""
        ...

    def start(self, worker_index: int, tf_config_json: str, attempt: int) -> None: ...

    def poll(self, worker_index: int) -> int | None:
        """The worker's exit code, or None while it runs."""
        ...

    def terminate(self, worker_index: int, grace_seconds: float) -> None:
        """Stops the worker (SIGTERM, then SIGKILL after `grace_seconds`; 0: SIGKILL at once)
        and waits for it."""
        ...

    def log_path(self, worker_index: int) -> str: ...

    def close(self) -> None:
        """Releases what the backend holds, once every worker has stopped."""
        ...


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
            raise LaunchError(f"--ports lists {len(self.ports)} ports for {num_workers} workers")
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
            return forker.Forker(self.worker_argv, env, preexec, held, self.log_path(0))
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
    """Ports the kernel reports free on loopback (held open together so they differ)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind((LOOPBACK, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def check_port_free(port: int) -> None:
    """Raises LaunchError when `port` cannot be bound on loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            raise LaunchError(
                f"port {port} on {LOOPBACK} is in use: free it, or leave out --ports to pick "
                "free ports"
            ) from None


def preflight(config: TrainConfig, num_workers: int) -> None:
    """Checks settings, the model (a model by import path is built once) and the manifest
    before any worker starts.

    Each worker still verifies its own files' checksums itself.
    """
    shard_manifest = manifest.read_manifest(config.data_dir)
    checks.check_settings(config, shard_manifest, num_workers)
    if user_model.is_import_path(config.model):
        from train.models import check_builds  # TF loads only for a model to build

        check_builds(config, shard_manifest)


def settle_start(config: TrainConfig) -> TrainConfig:
    """The config with `warm_start` settled to one starting model (or a cold start), once,
    before any worker starts: every worker then loads the same file (train.warm_start).

    Raises:
        ConfigError, ManifestError: bad settings or shard set.
    """
    config.check()
    if config.warm_start == "off":
        return config
    from train import warm_start  # TF loads only when a model must be looked at

    return warm_start.settle(config, manifest.read_manifest(config.data_dir))


def _last_error_line(path: str) -> str:
    """The worker's own one-line complaint ("error: ..."), else its last exception line."""
    with contextlib.suppress(OSError), open(path, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
        for line in reversed(lines):
            if line.startswith(ERROR_PREFIX):
                return line[len(ERROR_PREFIX) :]
        for line in reversed(lines):
            if re.match(r"^[\w.]+(Error|Exception)\b", line):
                return line
        return lines[-1] if lines else ""
    return ""


class _Tail:
    """Copies what the chief appends to its log onto the console."""

    def __init__(self, path: str, out: IO[str]) -> None:
        self.path = path
        self.out = out
        self.offset = os.path.getsize(path) if os.path.exists(path) else 0

    def pump(self) -> None:
        if not os.path.exists(self.path):
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        self.offset += len(chunk)
        if chunk:
            self.out.write(chunk.decode(errors="replace"))
            self.out.flush()


def _stop_all(backend: WorkerBackend, num_workers: int, grace_seconds: float) -> None:
    # In parallel: each terminate may wait out its grace period.
    stoppers = [
        threading.Thread(target=backend.terminate, args=(index, grace_seconds))
        for index in range(num_workers)
    ]
    for stopper in stoppers:
        stopper.start()
    for stopper in stoppers:
        stopper.join()


def run_cluster(
    backend: WorkerBackend, num_workers: int, max_restarts: int, out: IO[str] = sys.stdout
) -> None:
    """Runs the cluster to completion, restarting all workers when any one dies.

    Raises:
        LaunchError: a worker found bad input, or restarts are used up; names the worker
            and its log.
    """
    for attempt in range(max_restarts + 1):
        addresses = backend.addresses(num_workers)
        tail = _Tail(backend.log_path(0), out)
        failed = None
        try:
            for index in range(num_workers):
                backend.start(index, cluster.tf_config_json(addresses, index), attempt)
            failed = _watch(backend, num_workers, tail)
        finally:
            _stop_all(backend, num_workers, _grace_for_survivors(failed))
            tail.pump()
        if failed is None:
            return
        index, code = failed
        log_path = backend.log_path(index)
        reason = _last_error_line(log_path)
        if code == BAD_INPUT_EXIT_CODE:
            raise LaunchError(f"worker {index} rejected its input: {reason} (log: {log_path})")
        if code == EXIT_DISK_FULL:
            raise LaunchError(
                f"worker {index} ran out of disk space: {reason}; free space and rerun to "
                f"resume (log: {log_path})"
            )
        if not restart_may_help(code):
            raise LaunchError(
                f"worker {index} failed with exit code {code}, which a restart cannot fix: "
                f"{reason} (log: {log_path})"
            )
        if attempt < max_restarts:
            # A notice: the pipeline shows it in the terminal, not only in the stage's log.
            message = (
                f"worker {index} died (exit code {code}, log: {log_path}); restarting the "
                f"cluster (restart {attempt + 1} of {max_restarts})"
            )
            print(notice_line(message), file=out, flush=True)
    raise LaunchError(
        f"worker {index} failed with exit code {code} and max_restarts={max_restarts} "
        f"restarts are used up: {reason} (log: {log_path})"
    )


def _grace_for_survivors(failed: tuple[int, int] | None) -> float:
    """How long the workers still running get to end after SIGTERM before SIGKILL.

    The grace period lets them write a pre-emption backup (the launcher itself was stopped, or
    a worker exited after its pre-emption backup) or tidy up after the chief has finished.
    After any other death no survivor can save anything: every backup is a collective that
    needs all workers, so they are killed at once rather than left stuck in a collective for
    the grace period; the backup on disk is crash-consistent and the restart resumes from it.
    """
    if failed is None or failed[1] == EXIT_PREEMPTED:
        return STOP_GRACE_SECONDS
    return 0.0


def _watch(backend: WorkerBackend, num_workers: int, tail: _Tail) -> tuple[int, int] | None:
    """Waits until the chief finishes (None) or some worker fails ((index, exit code))."""
    while True:
        tail.pump()
        codes = [backend.poll(index) for index in range(num_workers)]
        for index, code in enumerate(codes):
            if code is not None and code != 0:
                return index, code
        if codes[0] == 0:
            # The chief writes history.json last; the others only tidy up after it.
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            while time.monotonic() < deadline and any(
                backend.poll(i) is None for i in range(num_workers)
            ):
                time.sleep(POLL_SECONDS)
            return None
        time.sleep(POLL_SECONDS)


def worker_argv(config: TrainConfig) -> list[str]:
    """The command line that runs one worker with `config`."""
    return [sys.executable, "-m", "train", "worker", *settings.flags(config)]


def check_launch_settings(num_workers: int, max_restarts: int, ports: list[int] | None) -> None:
    """Rejects launch-only settings no cluster can run with.

    Raises:
        ConfigError: naming the setting and what it must be.
    """
    if num_workers < 1:
        raise ConfigError(f"--num-workers must be at least 1, got {num_workers}")
    if max_restarts < 0:
        raise ConfigError(
            f"--max-restarts must be 0 or more (0: never restart), got {max_restarts}"
        )
    if ports is not None:
        if len(ports) != num_workers:
            raise ConfigError(
                f"--ports lists {len(ports)} ports for {num_workers} workers: give one per "
                "worker, or leave out --ports to pick free ports"
            )
        if any(not 0 < port < 65536 for port in ports) or len(set(ports)) != len(ports):
            raise ConfigError(f"--ports must be distinct ports in 1-65535, got {ports}")


def log_dir_for(config: TrainConfig, log_dir: str | None = None) -> str:
    """Where the workers' logs go: `log_dir`, or `<train dir>/logs`.

    Logs are appended to while the workers run, which an object store cannot do: for a gs://
    train dir they go to its local state folder (`contract.storage.local_state_dir`) and are
    copied to `<train dir>/logs` when the launch ends.
    """
    return log_dir or storage.local_state_dir(layout.join(config.train_dir, "logs"))


def launch(
    config: TrainConfig,
    num_workers: int,
    max_restarts: int = MAX_RESTARTS,
    ports: list[int] | None = None,
    log_dir: str | None = None,
    backend: WorkerBackend | None = None,
) -> None:
    """Checks the inputs, then trains with `num_workers` workers (worker 0 is chief).

    Args:
        backend: where the workers run; local processes on loopback `ports` when None.

    Raises:
        ConfigError, ManifestError: bad settings or shard set, before any worker starts.
        LaunchError: a port is in use, or training failed beyond `max_restarts`.
    """
    check_launch_settings(num_workers, max_restarts, ports)
    preflight(config, num_workers)
    if backend is None:
        backend = LocalProcessBackend(
            worker_argv(config), log_dir_for(config, log_dir), ports, private_network_for(config)
        )
    # On SIGTERM (e.g. from Luigi), unwind through run_cluster's finally to stop the workers.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        try:
            run_cluster(backend, num_workers, max_restarts)
        finally:
            backend.close()
            _copy_logs_to_store(config, log_dir)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _copy_logs_to_store(config: TrainConfig, log_dir: str | None) -> None:
    """Copies the workers' local logs of a gs:// train dir to `<train dir>/logs`."""
    remote = layout.join(config.train_dir, "logs")
    if log_dir is not None or not storage.is_remote(remote):
        return
    try:
        storage.upload_folder(log_dir_for(config), remote)
    except Exception as e:  # noqa: BLE001 - a lost log copy must not change training's result
        logger.warning("could not copy the workers' logs to %s: %s", remote, e)
