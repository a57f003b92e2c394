"""One training worker: the same entry point locally, in a container or in a TFJob pod."""

from __future__ import annotations

import logging
import time
from typing import Any

import tensorflow as tf
import tf_keras as keras

from contract import layout, manifest
from train import artifacts, callbacks, cluster, data, models
from train.config import ConfigError, TrainConfig
from train.trainer import Trainer
from train.validation import ExactValidation

log = logging.getLogger("train")


def check_settings(config: TrainConfig, shard_manifest: dict[str, Any], num_workers: int) -> None:
    """Checks the settings against each other and against the shard set's manifest.

    Raises:
        ConfigError: naming the setting that is wrong and what to do.
    """
    config.check()
    models.check_name(config.model)
    if shard_manifest["num_workers"] != num_workers:
        raise ConfigError(
            f"num_workers is {num_workers} but the shard set in {config.data_dir} was cut for "
            f"{shard_manifest['num_workers']} workers: train with "
            f"{shard_manifest['num_workers']} or rerun preprocess with {num_workers}"
        )
    if data.steps_per_epoch(shard_manifest, config.per_worker_batch_size) < 1:
        per_worker = shard_manifest["splits"][layout.TRAIN_SPLIT]["examples_per_worker"]
        raise ConfigError(
            f"per_worker_batch_size {config.per_worker_batch_size} exceeds the {per_worker} "
            "examples each worker holds: lower it"
        )


def check_inputs(config: TrainConfig, info: cluster.ClusterInfo) -> dict[str, Any]:
    """Checks settings, then this worker's files and the validation files, before training.

    Raises:
        ConfigError: a setting is wrong (see check_settings).
        ManifestError: the manifest or one of the files is missing or corrupt.
    """
    shard_manifest = manifest.read_manifest(config.data_dir)
    check_settings(config, shard_manifest, info.num_workers)
    manifest.verify(config.data_dir, split=layout.TRAIN_SPLIT, worker=info.worker_index)
    manifest.verify(config.data_dir, split=layout.VALIDATION_SPLIT)
    return shard_manifest


def build_trainer(
    config: TrainConfig, shard_manifest: dict[str, Any], strategy: tf.distribute.Strategy
) -> tuple[keras.Model, Trainer]:
    """The exported model and its compiled training wrapper, both made inside the scope."""
    image_shape = shard_manifest["image_shape"]
    with strategy.scope():
        core = models.build(config.model, image_shape, shard_manifest["num_classes"])
        trainer = Trainer(
            core,
            config.histogram_freq_steps,
            cluster.timed_collectives(config.collective_timeout_seconds),
        )
        trainer.compile(
            optimizer=keras.optimizers.Adam(config.learning_rate),
            loss=keras.losses.SparseCategoricalCrossentropy(),
            metrics=["accuracy"],
        )
        trainer.build((None, *image_shape))
    return core, trainer


def callback_stack(
    config: TrainConfig,
    info: cluster.ClusterInfo,
    validation: ExactValidation,
    recorder: callbacks.RunRecorder,
    writer: tf.summary.SummaryWriter,
) -> tuple[list[keras.callbacks.Callback], keras.callbacks.EarlyStopping | None]:
    """The callbacks in the order that matters: validation before anything reading val_loss."""
    stack = [
        recorder,
        callbacks.FaultInjection(info.worker_index, cluster.attempt_number()),
        keras.callbacks.BackupAndRestore(
            layout.join(config.train_dir, layout.BACKUP_DIR), save_freq=config.save_freq_steps
        ),
        validation,
        callbacks.LearningRateLog(),  # the rate the epoch used, before ReduceLROnPlateau
    ]
    early_stopping = None
    if config.early_stopping_patience > 0:
        early_stopping = keras.callbacks.EarlyStopping(
            monitor="val_loss", patience=config.early_stopping_patience, restore_best_weights=True
        )
        stack.append(early_stopping)
    if config.reduce_lr_patience > 0:
        stack.append(
            keras.callbacks.ReduceLROnPlateau(
                monitor="val_loss",
                factor=config.reduce_lr_factor,
                patience=config.reduce_lr_patience,
            )
        )
    if cluster.may_write_real_paths(info):
        stack.append(callbacks.ChiefTensorBoard(writer, config.scalar_freq_steps))
    stack.append(recorder.epoch_end_hook())
    return stack, early_stopping


def run(config: TrainConfig) -> dict[str, Any]:
    """Trains as one worker of the cluster in TF_CONFIG (a cluster of one without it).

    Returns:
        The history document; the chief has also written it, last, to the train folder.

    Raises:
        ConfigError, ManifestError: bad settings or input, found before any training.
    """
    started = time.perf_counter()
    info = cluster.read_cluster()
    shard_manifest = check_inputs(config, info)
    cluster.configure_threads(config.threads_per_worker)
    strategy = cluster.make_strategy()
    chief = cluster.may_write_real_paths(info)
    steps = data.steps_per_epoch(shard_manifest, config.per_worker_batch_size)
    global_batch = config.per_worker_batch_size * info.num_workers
    log.info(
        "worker %d of %d (chief=%s) attempt %d: %d steps/epoch, global batch %d",
        info.worker_index, info.num_workers, chief, cluster.attempt_number(), steps, global_batch,
    )  # fmt: skip
    core, trainer = build_trainer(config, shard_manifest, strategy)
    tensorboard_dir = layout.join(config.train_dir, layout.TENSORBOARD_DIR)
    writer = (
        tf.summary.create_file_writer(tensorboard_dir) if chief else tf.summary.create_noop_writer()
    )
    trainer.summary_writer = writer

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        return data.train_dataset(
            config.data_dir,
            shard_manifest,
            info.worker_index,
            config.per_worker_batch_size,
            config.shuffle_seed,
        )

    validation = ExactValidation(
        data.validation_dataset(
            config.data_dir,
            shard_manifest,
            info.worker_index,
            info.num_workers,
            config.validation_batch_size,
        ),
        strategy,
        shard_manifest["splits"][layout.VALIDATION_SPLIT]["num_examples"],
        cluster.timed_collectives(config.collective_timeout_seconds),
    )
    epochs_path = layout.join(config.train_dir, artifacts.EPOCHS_FILE) if chief else None
    recorder = callbacks.RunRecorder(epochs_path, config.epochs, global_batch)
    stack, early_stopping = callback_stack(config, info, validation, recorder, writer)
    trainer.fit(
        keras.utils.experimental.DatasetCreator(dataset_fn),
        epochs=config.epochs,
        steps_per_epoch=steps,
        callbacks=stack,
        verbose=0,
    )
    artifacts.save_final(core, trainer, config.train_dir, info)
    history = recorder.history()
    document = {
        "history": history,
        "epochs_completed": len(history["loss"]),
        "stopped_early": bool(early_stopping is not None and early_stopping.stopped_epoch > 0),
        "best_epoch": artifacts.best_epoch(history["val_loss"]),
        "steps_trained_total": callbacks.current_step(trainer),
        "steps_per_epoch": steps,
        "examples_per_second": recorder.examples_per_second(),
        "wall_time_seconds": time.perf_counter() - started,
        "num_workers": info.num_workers,
        "global_batch_size": global_batch,
        "per_worker_batch_size": config.per_worker_batch_size,
        "model": config.model,
        "validation_examples": validation.expected_count,
        "attempt": cluster.attempt_number(),
        "resumed_from_step": recorder.initial_step,
    }
    if chief:
        artifacts.remove_backup(config.train_dir)
        artifacts.write_config(config, config.train_dir)
        artifacts.write_history(config.train_dir, document)  # last: Luigi's completion marker
        writer.close()
    log.info(
        "done: %d epochs, %d steps", document["epochs_completed"], document["steps_trained_total"]
    )
    return document
