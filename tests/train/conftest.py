"""Fixtures of the train tests: shard sets and a way to run `python -m train` as a subprocess."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from contract import layout
from tests import factories, forked
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


def write_small_shard_set(
    data_dir: str, num_workers: int = 2, per_worker: int = 256, **options
) -> dict:
    return factories.write_shard_set(
        data_dir,
        num_workers=num_workers,
        per_worker=per_worker,
        num_validation=NUM_VALIDATION,
        **options,
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
        return forked.run(argv, env=env or train_env(), timeout=300)

    return run


def history(train_dir: str) -> dict:
    with open(os.path.join(train_dir, layout.HISTORY_FILE)) as f:
        return json.load(f)


def log_text(train_dir: str, worker: int) -> str:
    with open(os.path.join(train_dir, "logs", f"worker-{worker}.log")) as f:
        return f.read()


def weights_digest(train_dir: str) -> str:
    """The sha256 of every variable in the final checkpoint (model and optimizer), by name."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(os.path.join(train_dir, layout.FINAL_CHECKPOINT_DIR, "ckpt"))
    digest = hashlib.sha256()
    for name in sorted(reader.get_variable_to_shape_map()):
        if not name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH"):
            digest.update(name.encode() + reader.get_tensor(name).tobytes())
    return digest.hexdigest()
