"""The chief's final files: model, checkpoint, config, and history.json written last."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import time
from collections.abc import Callable
from typing import Any, TypeVar

import tensorflow as tf
import tf_keras as keras

from contract import atomic, layout
from contract.messages import no_space_left
from train import cluster, user_model
from train.config import TrainConfig

T = TypeVar("T")
log = logging.getLogger("train")
TRANSIENT_ERRORS = (OSError, tf.errors.UnavailableError, tf.errors.AbortedError)
CHECKPOINT_PREFIX = "ckpt"


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` says the filesystem is full (TensorFlow's file writers say so with a
    ResourceExhaustedError): no retry helps with that."""
    return isinstance(error, tf.errors.ResourceExhaustedError) or no_space_left(error)


def with_retries(
    action: Callable[[], T], what: str, attempts: int = 5, first_delay: float = 0.5
) -> T:
    """Runs file I/O, retrying transient filesystem errors with exponential backoff.

    A full disk is not retried. Only for plain file I/O: a collective must never be retried
    on one worker alone.
    """
    delay = first_delay
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except TRANSIENT_ERRORS as e:
            if attempt == attempts or is_disk_full(e):
                raise
            log.warning("%s failed (%s); retry %d in %.1fs", what, e, attempt, delay)
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def save_final(
    exported: keras.Model,
    core: keras.Model,
    trainer: keras.Model,
    train_dir: str,
    info: cluster.ClusterInfo,
) -> None:
    """Saves the exported model and a checkpoint of the trained model and its optimizer.

    Every worker saves (the saves read distributed variables); only the chief keeps them.

    Saves go to a local scratch folder first, so a retry repeats only the copy to the real
    path and never the collectives inside a save.
    """
    scratch = cluster.scratch_dir(info)
    try:
        exported.save(os.path.join(scratch, layout.MODEL_FILE))
        checkpoint = tf.train.Checkpoint(model=core, optimizer=trainer.optimizer)
        checkpoint.write(os.path.join(scratch, layout.FINAL_CHECKPOINT_DIR, CHECKPOINT_PREFIX))
        if not cluster.may_write_real_paths(info):
            return
        for root, _, files in os.walk(scratch):
            for name in files:
                source = os.path.join(root, name)
                rel = os.path.relpath(source, scratch).replace(os.sep, "/")
                target = layout.join(train_dir, rel)
                with_retries(
                    functools.partial(atomic.copy_atomic, source, target), f"copying {rel}"
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def write_config(config: TrainConfig, train_dir: str) -> None:
    """Writes the run's settings, with the file and sha256 of a model by import path."""
    path = layout.join(train_dir, layout.TRAIN_CONFIG_FILE)
    document = {**config.to_dict(), **user_model.source(config.model)}
    with_retries(lambda: atomic.write_json_atomic(path, document), f"writing {path}")


def write_history(train_dir: str, history: dict[str, Any]) -> None:
    """Writes history.json atomically; it is the stage's completion marker, so it goes last."""
    path = layout.join(train_dir, layout.HISTORY_FILE)
    with_retries(lambda: atomic.write_json_atomic(path, history), f"writing {path}")


def best_epoch(val_loss: list[float]) -> int:
    """The 1-based epoch with the lowest validation loss (0 when there is none)."""
    if not val_loss:
        return 0
    return min(range(len(val_loss)), key=val_loss.__getitem__) + 1


def remove_backup(train_dir: str) -> None:
    """Drops the backup (and any per-worker temp folder a killed worker left in it) once done.

    The final files were each made durable as they were written; the train folder's entries
    are flushed once more here, so a power loss cannot take them and the backup together.
    """
    path = layout.join(train_dir, layout.BACKUP_DIR)
    if tf.io.gfile.exists(path):
        atomic.sync_folder(train_dir)
        with_retries(lambda: tf.io.gfile.rmtree(path), f"removing {path}")
