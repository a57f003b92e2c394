"""The training settings' checks that need no TensorFlow: the launcher runs them before any
worker starts, each worker again before it trains.

A process that only launches (`python -m train launch`, in Luigi's Train task) thus refuses a
bad setting, or goes on to start the workers, without loading TensorFlow. Only a backup to
resume (its settings hold TensorFlow's version and kernels) or a model by import path (built
once, train.models.check_builds) loads it.
"""

from __future__ import annotations

from typing import Any

from contract import gfile, layout, manifest
from train import user_model
from train.config import ConfigError, TrainConfig, label_smoothing_with_own_loss

# The built-in models' names (train.models.MODELS builds them).
BUILT_IN_MODELS = ("cnn", "cnn2", "cnn3", "mlp")


def check_name(name: str, hparams: dict[str, Any] | None = None) -> None:
    """Checks that `name` is a built-in model, or a function by import path that imports.

    Raises:
        ConfigError: naming the known models, or what is wrong with the import path; or
            hyperparameters given to a built-in model, which takes none.
    """
    if user_model.is_import_path(name):
        user_model.resolve(name)
        return
    if name not in BUILT_IN_MODELS:
        raise ConfigError(
            f"unknown model {name!r}: choose one of {', '.join(sorted(BUILT_IN_MODELS))}, or "
            "give your own as package.module:function (docs/extending.md)"
        )
    if hparams:
        raise ConfigError(
            f"the built-in model {name!r} takes no hparams (got {', '.join(sorted(hparams))}): "
            "they are for a model given as package.module:function"
        )


def check_model_settings(config: TrainConfig) -> None:
    """Checks the model setting, its hparams and how its hooks go with the other settings.

    Raises:
        ConfigError: see `check_name`; or label smoothing asked of a module with its own loss.
    """
    check_name(config.model, config.hparams)
    if config.label_smoothing > 0 and user_model.has_loss_hook(config.model):
        raise ConfigError(label_smoothing_with_own_loss(config.model))


def is_settled(config: TrainConfig) -> bool:
    """Whether the config already names its starting model, or why it starts cold."""
    return config.warm_start == "off" or bool(config.warm_start_from or config.cold_start_reason)


def check_settings(config: TrainConfig, shard_manifest: dict[str, Any], num_workers: int) -> None:
    """Checks the settings against each other, the shard set's manifest and any backup.

    Raises:
        ConfigError: naming the setting that is wrong and what to do.
    """
    config.check()
    check_model_settings(config)
    if not is_settled(config):
        raise ConfigError(
            f"warm_start {config.warm_start} is settled by `python -m train launch` before the "
            "workers start: launch the workers with it, or give each worker the launcher's "
            "--warm-start-from and --warm-start-sha256 (or --cold-start-reason)"
        )
    if shard_manifest["num_workers"] != num_workers:
        raise ConfigError(
            f"num_workers is {num_workers} but the shard set in {config.data_dir} was cut for "
            f"{shard_manifest['num_workers']} workers: train with "
            f"{shard_manifest['num_workers']} or rerun preprocess with {num_workers}"
        )
    if manifest.steps_per_epoch(shard_manifest, config.per_worker_batch_size) < 1:
        per_worker = shard_manifest["splits"][layout.TRAIN_SPLIT]["examples_per_worker"]
        raise ConfigError(
            f"per_worker_batch_size {config.per_worker_batch_size} exceeds the {per_worker} "
            "examples each worker holds: lower it"
        )
    if has_backup_folder(config.train_dir):
        from train import backup  # its settings name TensorFlow's version and kernels

        backup.check_resume_settings(config, shard_manifest, num_workers)


def has_backup_folder(train_dir: str) -> bool:
    """Whether `train_dir` holds a backup folder, found without loading TensorFlow (which
    `train.backup` needs to read one)."""
    return gfile.exists(layout.join(train_dir, layout.BACKUP_DIR))
