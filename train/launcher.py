"""The launcher: checks a launch, settles its starting model, then runs its cluster.

`launch` checks the settings, the model and the shard set before any worker starts, runs the
workers through a backend (local processes, train.local_backend, unless another is given,
e.g. train.docker_backend's containers) and the restart loop (train.restarts), and copies
the workers' logs to a gs:// train dir when it ends (train.worker_logs).
"""

from __future__ import annotations

import logging
import signal
import sys

from contract import manifest, settings
from train import checks, local_backend, user_model, worker_logs
from train.config import MAX_RESTARTS, ConfigError, TrainConfig
from train.restarts import WorkerBackend, run_cluster

logger = logging.getLogger(__name__)


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
        backend = local_backend.LocalProcessBackend(
            worker_argv(config),
            worker_logs.log_dir_for(config, log_dir),
            ports,
            local_backend.private_network_for(config),
        )
    # On SIGTERM (e.g. from Luigi), unwind through run_cluster's finally to stop the workers.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        try:
            run_cluster(backend, num_workers, max_restarts)
        finally:
            backend.close()
            worker_logs.copy_logs_to_store(config, log_dir)
    finally:
        signal.signal(signal.SIGTERM, previous)
