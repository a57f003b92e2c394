"""One training worker: the same entry point locally, in a container or in a TFJob pod."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any

import tensorflow as tf
import tf_keras as keras

from contract import layout, manifest
from train import (
    artifacts,
    backup,
    callbacks,
    cluster,
    data,
    determinism,
    models,
    preemption,
    resumable,
    warm_start,
)
from train.checks import check_settings
from train.config import TrainConfig
from train.trainer import Trainer
from train.validation import ExactValidation

log = logging.getLogger("train")


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


def learning_rate(config: TrainConfig, steps_per_epoch: int) -> Any:
    """Adam's learning rate: a number ReduceLROnPlateau may lower, or the cosine schedule over
    `epochs` (after a warm run's fine-tune epochs), a function of the optimizer's step (restored
    with the backup, so a resume stays exact)."""
    peak = warm_start.learning_rate(config)
    if config.lr_schedule != "cosine":
        return peak
    finetune = warm_start.finetune_epochs(config) * steps_per_epoch
    warmup = config.warmup_epochs * steps_per_epoch
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else peak,
        decay_steps=max(1, config.epochs * steps_per_epoch - warmup),
        warmup_target=peak if warmup else None,
        warmup_steps=warmup,
    )
    if not finetune:
        return schedule
    return FineTuneFirst(finetune, warm_start.finetune_learning_rate(config), schedule)


@keras.utils.register_keras_serializable(package="train")
class FineTuneFirst(keras.optimizers.schedules.LearningRateSchedule):
    """`steps` of fine-tuning, the rate falling from `rate` to 0 along a half cosine, then
    `then` from its own step 0: a warm restart (SGDR) that first settles the starting model
    on the new data at a low rate."""

    def __init__(
        self, steps: int, rate: float, then: keras.optimizers.schedules.LearningRateSchedule
    ) -> None:
        super().__init__()
        self.steps = steps
        self.rate = rate
        self.then = then

    def __call__(self, step: Any) -> tf.Tensor:
        step = tf.cast(step, tf.float32)
        done = tf.minimum(step, float(self.steps)) / float(self.steps)
        finetune = self.rate * 0.5 * (1.0 + tf.cos(math.pi * done))
        after = self.then(tf.maximum(step - float(self.steps), 0.0))
        return tf.where(step < float(self.steps), finetune, tf.cast(after, tf.float32))

    def get_config(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "rate": self.rate,
            "then": keras.optimizers.schedules.serialize(self.then),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> FineTuneFirst:
        then = keras.optimizers.schedules.deserialize(config["then"])
        return cls(config["steps"], config["rate"], then)


class SmoothedSparseCrossentropy(keras.losses.Loss):
    """Cross-entropy of integer labels against targets moved `smoothing` towards uniform."""

    def __init__(self, num_classes: int, smoothing: float, **kwargs: Any) -> None:
        super().__init__(name=kwargs.pop("name", "smoothed_crossentropy"), **kwargs)
        self.num_classes = num_classes
        self.smoothing = smoothing

    def call(self, labels: tf.Tensor, probabilities: tf.Tensor) -> tf.Tensor:
        one_hot = tf.one_hot(tf.cast(tf.reshape(labels, [-1]), tf.int32), self.num_classes)
        return keras.losses.categorical_crossentropy(
            one_hot, probabilities, label_smoothing=self.smoothing
        )

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "num_classes": self.num_classes,
                "smoothing": self.smoothing}  # fmt: skip


def loss(config: TrainConfig, num_classes: int) -> keras.losses.Loss:
    """Cross-entropy on integer labels, smoothed when `label_smoothing` > 0."""
    if config.label_smoothing <= 0:
        return keras.losses.SparseCategoricalCrossentropy()
    return SmoothedSparseCrossentropy(num_classes, config.label_smoothing)


def build_trainer(
    config: TrainConfig, shard_manifest: dict[str, Any], strategy: tf.distribute.Strategy
) -> tuple[keras.Model, keras.Model, Trainer]:
    """The trained model, the model validated and exported (the same, or it with test-time
    flips) and the compiled training wrapper, all made inside the scope."""
    image_shape = shard_manifest["image_shape"]
    with strategy.scope():
        core = models.build_for_run(config, shard_manifest)
        exported = models.for_inference(core, config.test_time_augment)
        trainer = Trainer(
            core,
            config.histogram_freq_steps,
            cluster.timed_collectives(config.collective_timeout_seconds),
            autograph=not models.is_built_in(config.model),
        )
        rate = learning_rate(
            config, manifest.steps_per_epoch(shard_manifest, config.per_worker_batch_size)
        )
        trainer.compile(
            optimizer=models.optimizer(config, rate) or keras.optimizers.Adam(rate),
            loss=models.loss(config) or loss(config, shard_manifest["num_classes"]),
            metrics=["accuracy"],
        )
        trainer.build((None, *image_shape))
        # The compiled loss and metrics make their variables on first use; make them now,
        # so that a resume can put back their running sums (backup.WorkerLocalValues).
        probabilities = tf.zeros([1, shard_manifest["num_classes"]])
        labels = tf.zeros([1], tf.int64)
        trainer.compiled_loss.build(probabilities)
        trainer.compiled_metrics.build(probabilities, labels)
    return core, exported, trainer


def callback_stack(
    config: TrainConfig,
    info: cluster.ClusterInfo,
    parts: RunParts,
    steps_per_epoch: int,
) -> list[keras.callbacks.Callback]:
    """The callbacks in the order that matters: validation before anything reading val_loss,
    and the backups last, so that they save the whole epoch's outcome (the pre-emption save
    after the scheduled one, which it then need not repeat)."""
    state = parts.state
    stack: list[keras.callbacks.Callback] = [
        resumable.RestoreRunningMetrics(parts.run_backup.worker_local, state.step),
        parts.recorder,
        callbacks.TrainMetrics(config.scalar_freq_steps),
        parts.validation,
        callbacks.FaultInjection(info.worker_index, cluster.attempt_number()),
        callbacks.LearningRateLog(),  # the rate the epoch used, before ReduceLROnPlateau
        resumable.BestEpoch(state, parts.best_weights, parts.core),
    ]
    if config.early_stopping_patience > 0:
        stack.append(resumable.ResumableEarlyStopping(state, config.early_stopping_patience))
    if config.reduce_lr_patience > 0 and config.lr_schedule == "plateau":
        stack.append(
            resumable.ResumablePlateau(state, config.reduce_lr_patience, config.reduce_lr_factor)
        )
    if cluster.may_write_real_paths(info):
        stack.append(callbacks.ChiefTensorBoard(parts.writer, config.scalar_freq_steps))
    stack.append(parts.recorder.epoch_end_hook())
    stack.append(
        resumable.BackupSchedule(
            parts.run_backup,
            state,
            steps_per_epoch,
            warm_start.total_epochs(config),
            config.save_freq_steps,
        )
    )
    stack.append(preemption.SaveOnPreemption(parts.run_backup, state, info, steps_per_epoch))
    return stack


@dataclasses.dataclass
class RunParts:
    """What one worker's run is made of, built once and shared by the callbacks."""

    core: keras.Model
    trainer: Trainer
    state: backup.RunState
    run_backup: backup.Backup
    best_weights: backup.BestWeights
    validation: ExactValidation
    recorder: callbacks.RunRecorder
    writer: tf.summary.SummaryWriter


def restore_or_begin(
    config: TrainConfig,
    info: cluster.ClusterInfo,
    shard_manifest: dict[str, Any],
    strategy: tf.distribute.Strategy,
    core: keras.Model,
    trainer: Trainer,
) -> tuple[backup.RunState, backup.Backup, backup.BestWeights]:
    """Restores the backup into the model, optimizer and run state, or starts a fresh run."""
    with strategy.scope():
        trainer.optimizer.build(trainer.trainable_variables)  # its slots must exist to restore
    best_weights = backup.BestWeights(core)
    options = cluster.timed_collectives(config.collective_timeout_seconds)
    worker_local = backup.WorkerLocalValues(
        [v for v in core.variables if v.synchronization == tf.VariableSynchronization.ON_READ],
        [v for metric in trainer.metrics for v in metric.variables],
        strategy,
        info,
        options,
    )
    trackables = {
        "trainer": trainer,
        "optimizer": trainer.optimizer,
        "best_weights": best_weights,
        "random": _Generators(determinism.random_generators(core)),
    }
    run_backup = backup.Backup(
        config.train_dir,
        info,
        strategy,
        trackables,
        worker_local,
        options,
    )
    state = run_backup.restore()
    if state is None:  # a fresh start: the starting model's weights, if warm; else the backup's
        warm_start.load_into(core, config)
        state = backup.RunState()
        run_backup.begin(backup.fingerprint(config, shard_manifest, info.num_workers))
    return state, run_backup, best_weights


class _Generators(tf.Module):
    def __init__(self, generators: dict[str, tf.random.Generator]) -> None:
        super().__init__(name="random_generators")
        self.generators = generators


def run(config: TrainConfig) -> dict[str, Any]:
    """Trains as one worker of the cluster in TF_CONFIG (a cluster of one without it).

    Resumes from the backup when there is one: exactly, to the weights an uninterrupted run
    would reach. The final model is the best epoch's (lowest val_loss) of the whole run.

    Returns:
        The history document; the chief has also written it, last, to the train folder.

    Raises:
        ConfigError, ManifestError: bad settings or input, found before any training.
        BackupError: the backup could not be written (every worker raises it together).
    """
    started = time.perf_counter()
    config = config.resolved()
    info = cluster.read_cluster()
    attempt = cluster.attempt_number()
    fault = callbacks.fault_point(info.worker_index, attempt)
    shard_manifest = check_inputs(config, info)
    cluster.configure_threads(config.threads_per_worker)
    determinism.make_deterministic(config.seed)
    strategy = cluster.make_strategy()
    cluster.check_workers_agree(
        strategy,
        info,
        backup.fingerprint(config, shard_manifest, info.num_workers),
        cluster.timed_collectives(config.collective_timeout_seconds),
    )
    chief = cluster.may_write_real_paths(info)
    steps = manifest.steps_per_epoch(shard_manifest, config.per_worker_batch_size)
    global_batch = config.per_worker_batch_size * info.num_workers
    plan = data.input_plan(
        shard_manifest, info.worker_index, config.per_worker_batch_size,
        config.input_memory_budget_mb,
    )  # fmt: skip
    log.info(
        "worker %d of %d (chief=%s) attempt %d: %d steps/epoch, global batch %d, seed %d, "
        "precision %s, input %s",
        info.worker_index, info.num_workers, chief, attempt, steps, global_batch, config.seed,
        config.precision, plan.describe(),
    )  # fmt: skip
    core, exported, trainer = build_trainer(config, shard_manifest, strategy)
    state, run_backup, best_weights = restore_or_begin(
        config, info, shard_manifest, strategy, core, trainer
    )
    resumed_from_step = callbacks.current_step(trainer)
    tensorboard_dir = layout.join(config.train_dir, layout.TENSORBOARD_DIR)
    writer = (
        tf.summary.create_file_writer(tensorboard_dir) if chief else tf.summary.create_noop_writer()
    )
    trainer.summary_writer = writer
    recorder = callbacks.RunRecorder(state, chief, warm_start.total_epochs(config), global_batch)
    if state.finished:
        log.info("the backup holds a finished run: writing its final files without training")
    else:
        start_epoch, start_step = state.epoch, state.step

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            return data.train_dataset(
                config.data_dir,
                shard_manifest,
                info.worker_index,
                config.per_worker_batch_size,
                config.seed,
                start_epoch,
                start_step,
                config.input_memory_budget_mb,
                config.augment,
            )

        validation = ExactValidation(
            exported,
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
            autograph=trainer.autograph,
        )
        parts = RunParts(
            core, trainer, state, run_backup, best_weights, validation, recorder, writer
        )
        trainer.start_position = (start_epoch, start_step)
        data.untune_device_datasets()
        trainer.fit(
            keras.utils.experimental.DatasetCreator(dataset_fn),
            epochs=warm_start.total_epochs(config),
            initial_epoch=start_epoch,
            steps_per_epoch=steps,
            callbacks=callback_stack(config, info, parts, steps),
            verbose=0,
        )
        # What fit spends after its last callback (tearing down its input iterators).
        recorder.fit_return_seconds = time.perf_counter() - recorder.train_ended_at
        log.info("fit returned %.2f s after training ended", recorder.fit_return_seconds)
    callbacks.die_if_at(fault, "trained")
    if state.best_epoch >= 0:
        best_weights.apply(core)
    artifacts.save_final(exported, core, trainer, config.train_dir, info)
    callbacks.die_if_at(fault, "saved")
    history = recorder.history()
    document = {
        "history": history,
        "epochs_completed": len(history["loss"]),
        "stopped_early": int(state.early_stopping.get("stopped_epoch", 0)) > 0,
        "best_epoch": state.best_epoch + 1,
        "steps_trained_total": callbacks.current_step(trainer),
        "steps_per_epoch": steps,
        "examples_per_second": recorder.examples_per_second(),
        "fit_return_seconds": recorder.fit_return_seconds,
        "wall_time_seconds": time.perf_counter() - started,
        "num_workers": info.num_workers,
        "global_batch_size": global_batch,
        "per_worker_batch_size": config.per_worker_batch_size,
        "model": config.model,
        "precision": config.precision,
        "seed": config.seed,
        "validation_examples": shard_manifest["splits"][layout.VALIDATION_SPLIT]["num_examples"],
        "attempt": attempt,
        "resumed_from_step": resumed_from_step,
        "warm_start": warm_start.record(config),
    }
    if chief:
        artifacts.write_config(config, config.train_dir)
        artifacts.write_history(config.train_dir, document)  # last: Luigi's completion marker
        callbacks.die_if_at(fault, "finished")
        run_backup.remove()  # only now: a kill before this resumes to these same files
        writer.close()
    log.info(
        "done: %d epochs, %d steps", document["epochs_completed"], document["steps_trained_total"]
    )
    return document
