"""Fixtures of the train tests: shard sets and a way to run `python -m train` as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests import factories
from tests.factories import PROJECT_ROOT

# Small enough to train two workers in seconds; 203 validation examples is no multiple of 64.
SMALL_RUN = {
    "model": "mlp",
    "epochs": 3,
    "per_worker_batch_size": 16,
    "validation_batch_size": 64,
    "save_freq_steps": 5,
    "scalar_freq_steps": 4,
    "histogram_freq_steps": 6,
    "early_stopping_patience": 0,
    "reduce_lr_patience": 0,
    "collective_timeout_seconds": 60.0,
}
NUM_VALIDATION = 203


def write_small_shard_set(data_dir: str, num_workers: int = 2) -> dict:
    return factories.write_shard_set(
        data_dir, num_workers=num_workers, per_worker=256, num_validation=NUM_VALIDATION
    )


def launch_argv(data_dir: str, train_dir: str, num_workers: int = 2, **overrides) -> list[str]:
    """The `python -m train launch` command line for a small run."""
    settings = {**SMALL_RUN, **overrides}
    argv = [sys.executable, "-m", "train", "launch", "--data-dir", data_dir]
    argv += ["--train-dir", train_dir, "--num-workers", str(num_workers)]
    for name, value in settings.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def train_env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "TF_USE_LEGACY_KERAS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": str(PROJECT_ROOT),
        **extra,
    }


RunTrain = Callable[..., subprocess.CompletedProcess]


@pytest.fixture
def run_train() -> RunTrain:
    """Runs `python -m train launch` to completion and returns the finished process."""

    def run(data_dir: str, train_dir: str, env: dict[str, str] | None = None, **kw):
        argv = launch_argv(data_dir, train_dir, **kw)
        return subprocess.run(
            argv,
            cwd=PROJECT_ROOT,
            env=env or train_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )

    return run
