"""Command line: `python -m train launch` (a cluster of workers) and `python -m train worker` (one).

`launch --backend local` (default) runs the workers as local processes; `--backend docker
--image IMG` runs each in its own container of IMG, with the same flags and the same restarts.
"""

from __future__ import annotations

import argparse
import logging
import sys

from contract import run_lock, settings, storage
from contract.containers import ContainerError, ContainerSettings
from contract.manifest import ManifestError
from contract.messages import (
    EXIT_BAD_INPUT,
    EXIT_DISK_FULL,
    EXIT_FAILED,
    EXIT_RETRYABLE,
    StageArgumentParser,
    error_line,
    no_space_left,
    notice_line,
)
from contract.storage import UnsupportedStorageError
from train import cluster
from train.config import MAX_RESTARTS, ConfigError, TrainConfig
from train.docker_backend import DockerWorkerBackend
from train.launcher import worker_argv
from train.restarts import LaunchError
from train.worker_logs import log_dir_for


def precision_notice(precision: str) -> str:
    """What the terminal says about the policy `--precision auto` settled on."""
    reason = "has" if precision == "mixed_bfloat16" else "lacks"
    return f"precision auto: {precision} (this CPU {reason} AMX-BF16)"


def _ports(text: str) -> list[int]:
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated port numbers, got {text!r}"
        ) from None


def _add_launch_flags(launch: argparse.ArgumentParser) -> None:
    launch.add_argument("--num-workers", type=int, required=True)
    launch.add_argument(
        "--max-restarts",
        type=int,
        default=MAX_RESTARTS,
        help=f"whole-cluster restarts after a worker dies (0: none; default {MAX_RESTARTS})",
    )
    launch.add_argument("--log-dir", help="worker logs (default: <train dir>/logs)")
    launch.add_argument(
        "--backend",
        choices=["local", "docker"],
        default="local",
        help="where the workers run: local processes, or one container each (default local)",
    )
    launch.add_argument(
        "--ports", type=_ports, help="local: comma-separated loopback ports (default: free)"
    )
    launch.add_argument("--image", help="docker: the stages' image (required with docker)")
    launch.add_argument(
        "--docker-mount",
        action="append",
        default=[],
        help="docker: a folder mounted at its own absolute path, ':ro' for read-only; "
        "repeat for several. Every path training reads or writes must lie in one.",
    )
    launch.add_argument(
        "--docker-user",
        default="",
        help="docker: uid:gid of the containers (default: yours; the image's user for root)",
    )
    launch.add_argument(
        "--worker-port", type=int, default=2222, help="docker: each worker's port (default 2222)"
    )


def _docker_backend(args: argparse.Namespace, config: TrainConfig) -> DockerWorkerBackend:
    if not args.image:
        raise ConfigError("--backend docker needs --image: the stages' image to run workers in")
    if args.ports is not None:
        raise ConfigError("--ports is for --backend local; containers use --worker-port")
    for flag, path in (("--data-dir", config.data_dir), ("--train-dir", config.train_dir)):
        if "://" in path:
            raise ConfigError(
                f"--backend docker needs a local {flag}, got {path}: containers see only mounted "
                "folders and get no cloud credentials; use --backend local for gs:// paths"
            )
    settings = ContainerSettings(args.image, tuple(args.docker_mount), args.docker_user)
    # The launcher's own worker command line, run by the image's python.
    worker_command = ["python", *worker_argv(config)[1:]]
    return DockerWorkerBackend(
        settings,
        args.worker_port,
        worker_command,
        config.train_dir,
        log_dir_for(config, args.log_dir),
    )


def main(argv: list[str] | None = None) -> int:
    parser = StageArgumentParser(prog="python -m train", description=__doc__)
    commands = parser.add_subparsers(
        dest="command", required=True, parser_class=StageArgumentParser
    )
    launch = commands.add_parser("launch", help="run a cluster of workers and restart it")
    settings.add_flags(launch, TrainConfig)
    _add_launch_flags(launch)
    worker = commands.add_parser("worker", help="run one worker; the cluster comes from TF_CONFIG")
    settings.add_flags(worker, TrainConfig)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0), or a bad flag (already reported in one line)
        return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("absl").setLevel(logging.WARNING)
    tf_logger = logging.getLogger("tensorflow")
    tf_logger.setLevel(logging.WARNING)
    tf_logger.propagate = False
    # "auto" precision is settled once, here: every worker gets the same, concrete policy.
    config = settings.from_flags(TrainConfig, args).resolved()
    if args.command == "launch" and args.precision == "auto":
        print(notice_line(precision_notice(config.precision)), flush=True)
    try:
        config.check()  # before the lock and before any worker: bad settings are one line
        storage.check_supported(config.data_dir, "data dir")
        storage.check_supported(config.train_dir, "train dir")
        if args.command == "launch":
            from train.launcher import launch as launch_cluster
            from train.launcher import settle_start

            run_lock.hold_for_process(config.run_dir())
            # Like "auto" precision, settled once: every worker starts from the same model.
            config = settle_start(config)
            if config.warm_start != "off":
                from train.warm_start import notice

                print(notice_line(notice(config)), flush=True)
            backend = _docker_backend(args, config) if args.backend == "docker" else None
            launch_cluster(
                config, args.num_workers, args.max_restarts, args.ports, args.log_dir, backend
            )
        else:
            return _run_worker(config)
    except (ConfigError, ManifestError, cluster.ClusterError, UnsupportedStorageError) as e:
        print(error_line(str(e)), file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    except (LaunchError, ContainerError, run_lock.RunLockedError) as e:
        print(error_line(str(e)), file=sys.stderr, flush=True)
        return EXIT_FAILED
    return 0


def _run_worker(config: TrainConfig) -> int:
    """Runs one worker; its exit code says whether starting it again could help.

    Settings or input found wrong before training exit EXIT_BAD_INPUT (raised to `main`); a
    shard found corrupt while training reads it does too, and a full disk exits
    EXIT_DISK_FULL: the launcher and a TFJob (`restartPolicy: ExitCode`) give up on both at
    once. Anything else (a vanished peer, a collective timing out) exits EXIT_RETRYABLE.
    """
    import tensorflow as tf

    from train.backup import DiskFullError
    from train.worker import run

    try:
        run(config)
    except (ConfigError, ManifestError, cluster.ClusterError, UnsupportedStorageError):
        raise
    except tf.errors.DataLossError as e:
        logging.getLogger("train").exception("corrupt input")
        message = f"a shard in {config.data_dir} is corrupt ({e.message}): rerun preprocess"
        print(error_line(message), file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    except Exception as e:  # noqa: BLE001 - every other failure is reported and may be retried
        logging.getLogger("train").exception("worker failed")
        print(error_line(str(e) or type(e).__name__), file=sys.stderr, flush=True)
        if isinstance(e, DiskFullError) or no_space_left(e):
            return EXIT_DISK_FULL
        return EXIT_RETRYABLE
    return 0


if __name__ == "__main__":
    from train import forker

    if forker.is_forker():
        forker.serve()  # returns in each worker it forks, which goes on as `worker` below
    sys.exit(main())
