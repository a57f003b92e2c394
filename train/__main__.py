"""Command line: `python -m train launch` (a local cluster) and `python -m train worker` (one)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from contract.manifest import ManifestError
from train import cluster
from train.config import ConfigError, TrainConfig
from train.launcher import BAD_INPUT_EXIT_CODE, ERROR_PREFIX, LaunchError


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    for field in dataclasses.fields(TrainConfig):
        flag = f"--{field.name.replace('_', '-')}"
        if field.default is dataclasses.MISSING:
            parser.add_argument(flag, required=True)
        else:
            kind = type(field.default)
            parser.add_argument(
                flag, type=kind, default=field.default, help=f"(default {field.default})"
            )


def _config(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})


def _ports(text: str) -> list[int]:
    return [int(p) for p in text.split(",") if p]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    launch = commands.add_parser("launch", help="run a local cluster of worker processes")
    _add_config_flags(launch)
    launch.add_argument("--num-workers", type=int, required=True)
    launch.add_argument("--max-restarts", type=int, default=2)
    launch.add_argument(
        "--ports", type=_ports, help="comma-separated loopback ports (default: free)"
    )
    launch.add_argument("--log-dir", help="worker logs (default: <train dir>/logs)")
    worker = commands.add_parser("worker", help="run one worker; the cluster comes from TF_CONFIG")
    _add_config_flags(worker)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("absl").setLevel(logging.WARNING)
    tf_logger = logging.getLogger("tensorflow")
    tf_logger.setLevel(logging.WARNING)
    tf_logger.propagate = False
    config = _config(args)
    try:
        if args.command == "launch":
            from train.launcher import launch as launch_cluster

            launch_cluster(config, args.num_workers, args.max_restarts, args.ports, args.log_dir)
        else:
            from train.worker import run

            run(config)
    except (ConfigError, ManifestError, cluster.ClusterError) as e:
        print(f"{ERROR_PREFIX}{e}", file=sys.stderr, flush=True)
        return BAD_INPUT_EXIT_CODE
    except LaunchError as e:
        print(f"{ERROR_PREFIX}{e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
