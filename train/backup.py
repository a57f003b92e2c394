"""The run's backup: all the state that decides training's outcome, saved together and restored.

Under `<train dir>/backup/` (written by the chief; every worker takes part in every save):

- `settings.json`: the settings that shape training (`fingerprint`), written before the first
  checkpoint; a resume with other settings is refused (`check_resume_settings`).
- `ckpt-N.*`: a checkpoint of the model, the optimizer (its step and learning rate), the
  dropout layers' random generators and the best epoch's weights.
- `state.json`, written last and atomically: names the current checkpoint and holds the rest
  of the state (the input position, early stopping and plateau state, the best epoch, every
  epoch's metrics). A checkpoint it does not name is never read, so a kill at any moment
  leaves the previous consistent pair in place.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import json
import logging
import math
import os
import shutil
import time
from typing import Any

import tensorflow as tf
import tf_keras as keras

from contract import atomic, layout
from train import artifacts, cluster, user_model
from train.config import SHAPING_SETTINGS, ConfigError, TrainConfig
from train.data import input_description

SETTINGS_FILE = "settings.json"
STATE_FILE = "state.json"
CHECKPOINT_PREFIX = "ckpt"
# What TensorFlow's checkpointing (tensorflow/python/checkpoint/saveable_compat.py) reads off
# each object it saves for the name of a legacy saveable; None: the object has none.
LEGACY_SAVEABLE_NAME = "_LEGACY_SAVEABLE_NAME"
# The settings a resume must share with the backup (those that shape training; the rest, log
# and save frequencies or timeouts, may change between attempts): each as itself, but for
# those that enter the fingerprint through a derived value (`fingerprinted_as`: the input
# description, the model code). Threads shape training: a worker's intra-op thread count
# changes how its reductions are split, and so the rounding of every step.
FINGERPRINTED_SETTINGS = tuple(
    name
    for name in SHAPING_SETTINGS
    if "fingerprinted_as" not in TrainConfig.__dataclass_fields__[name].metadata
)
# Test-only: "<first save>:<failures>:<errno name>" makes the chief's next <failures> writes
# to the backup folder, from save number <first save> (1-based) on, fail with that OSError,
# on the first attempt only.
FAULT_IO_ENV = "TRAIN_FAULT_BACKUP_IO"

log = logging.getLogger("train")


class BackupError(RuntimeError):
    """The backup could not be written; every worker raises it at the same save."""


class DiskFullError(BackupError):
    """The backup could not be written for a full disk, on some worker: no restart can help."""


@dataclasses.dataclass
class RunState:
    """The part of the training state that lives in Python, saved in `state.json`.

    `epoch` and `step` are where training goes on: the next batch to train. `finished` is set
    by the save after the last epoch (or the early stop), so a restart after it trains nothing.
    """

    epoch: int = 0
    step: int = 0
    finished: bool = False
    saves: int = 0
    checkpoint: str = ""
    epoch_logs: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
    # epoch -> [training steps, their seconds, 1 if it was its attempt's first epoch else 0];
    # kept across restarts so that the run's throughput counts every attempt's epochs.
    epoch_timings: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    best_epoch: int = -1  # 0-based; -1 before any epoch is validated
    best_val_loss: float = math.inf
    early_stopping: dict[str, float] = dataclasses.field(default_factory=dict)
    plateau: dict[str, float] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["epoch_logs"] = {str(k): v for k, v in self.epoch_logs.items()}
        doc["epoch_timings"] = {str(k): v for k, v in self.epoch_timings.items()}
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RunState:
        values = dict(doc)
        values["epoch_logs"] = {int(k): v for k, v in doc.get("epoch_logs", {}).items()}
        values["epoch_timings"] = {int(k): v for k, v in doc.get("epoch_timings", {}).items()}
        return cls(**values)


def fingerprint(
    config: TrainConfig, shard_manifest: dict[str, Any], num_workers: int
) -> dict[str, Any]:
    """The settings that shape training, the worker count, the shard set's identity, how
    each worker reads it (in memory or streamed: another order), the CPU kernels it runs
    (oneDNN or Eigen: another rounding) and the TensorFlow and Keras versions (other kernels
    and another checkpoint format)."""
    digests = sorted(entry["sha256"] for entry in shard_manifest["files"])
    data = hashlib.sha256(json.dumps(digests).encode()).hexdigest()[:16]
    values: dict[str, Any] = {name: getattr(config, name) for name in FINGERPRINTED_SETTINGS}
    reading = input_description(
        shard_manifest, num_workers, config.per_worker_batch_size, config.input_memory_budget_mb
    )
    return {
        **values,
        "num_workers": num_workers,
        "shard_set": data,
        "input": reading,
        "kernels": cluster.kernel_library(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        **model_code(config),
    }


def model_code(config: TrainConfig) -> dict[str, Any]:
    """A model by import path's hparams and its module's content hash (nothing for a built-in
    model): a resume or a worker with other model code is refused like one with other
    settings. The file's path stays out: a container may see the same module at another path."""
    source = user_model.source(config.model)
    if not source:
        return {}
    return {"hparams": config.hparams, "model_sha256": source["model_sha256"]}


def backup_dir(train_dir: str) -> str:
    return layout.join(train_dir, layout.BACKUP_DIR)


def has_checkpoint(train_dir: str) -> bool:
    """Whether the backup holds a resumable state (a checkpoint named by state.json)."""
    return tf.io.gfile.exists(layout.join(backup_dir(train_dir), STATE_FILE))


def check_resume_settings(
    config: TrainConfig, shard_manifest: dict[str, Any], num_workers: int
) -> None:
    """Refuses to resume a backup made with other settings, or whose settings are missing.

    Raises:
        ConfigError: naming each setting that differs and the two ways out, or the missing
            settings file.
    """
    folder = backup_dir(config.train_dir)
    path = layout.join(folder, SETTINGS_FILE)
    if not has_checkpoint(config.train_dir):
        return
    if not tf.io.gfile.exists(path):
        # Written before the first checkpoint: without it nothing says what made the backup.
        raise ConfigError(
            f"the backup in {folder} has no {SETTINGS_FILE}, so the settings it was made with "
            "cannot be checked and it is not resumed: start training over with --force-stage "
            f"train (or by removing {folder})"
        )
    saved = atomic.read_json(path)
    current = fingerprint(config, shard_manifest, num_workers)
    differ = [
        f"{name} {saved.get(name)!r} -> {current.get(name)!r}"
        for name in sorted(set(saved) | set(current))
        if saved.get(name) != current.get(name)
    ]
    if differ:
        raise ConfigError(
            f"the backup in {folder} was made with other settings ({', '.join(differ)}): "
            "rerun with the backup's settings to resume it, or start training over with "
            f"--force-stage train (or by removing {folder})"
        )


class _InjectedFaults:
    """Test-only: makes the chief's writes to the backup folder fail as FAULT_IO_ENV says."""

    def __init__(self) -> None:
        spec = os.environ.get(FAULT_IO_ENV, "")
        armed = bool(spec) and cluster.attempt_number() == 0
        first, failures, name = spec.split(":") if armed else ("0", "0", "EIO")
        self.first_save, self.left, self.code = int(first), int(failures), getattr(errno, name)

    def check(self, save_number: int) -> None:
        if save_number >= self.first_save and self.left > 0:
            self.left -= 1
            raise OSError(self.code, f"injected {errno.errorcode[self.code]}")


class BestWeights(tf.Module):
    """A copy of the model's weights (plain local variables) taken at the best epoch's end."""

    def __init__(self, model: keras.Model) -> None:
        super().__init__(name="best_weights")
        self.values = [
            tf.Variable(tf.zeros(w.shape, w.dtype), trainable=False, name=f"best_{i}")
            for i, w in enumerate(model.weights)
        ]

    def capture(self, model: keras.Model) -> None:
        """Copies the model's weights; a collective under MWMS, so every worker calls it."""
        for variable, value in zip(self.values, model.get_weights(), strict=True):
            variable.assign(value)

    def apply(self, model: keras.Model) -> None:
        model.set_weights([v.numpy() for v in self.values])


def answer_legacy_saveable_name(variables: list[tf.Variable]) -> None:
    """Gives each variable the legacy saveable name a save looks up, as None (it has none).

    A save looks the name up on every variable it writes (saveable_compat.get_saveable_name).
    On a sync-on-read variable the lookup of a missing attribute falls through to a read of
    its value across the workers: a collective per variable per save, for nothing.
    """
    for variable in variables:
        setattr(variable, LEGACY_SAVEABLE_NAME, None)


class WorkerLocalValues:
    """Each worker's own values of its sync-on-read variables, gathered into the backup.

    Under MultiWorkerMirroredStrategy batch norm's moving statistics and the running metric
    sums are per worker; a checkpoint keeps only their cross-worker mean or sum, and resuming
    from that rounds differently than the uninterrupted run. `saved` (one row per worker) is
    what the backup keeps instead.
    """

    def __init__(
        self,
        model_variables: list[tf.Variable],
        metric_variables: list[tf.Variable],
        strategy: tf.distribute.Strategy,
        info: cluster.ClusterInfo,
        collective_options: tf.distribute.experimental.CommunicationOptions,
    ) -> None:
        self.variables = [*model_variables, *metric_variables]
        self.is_metric = [False] * len(model_variables) + [True] * len(metric_variables)
        self.sizes = [v.shape.num_elements() for v in self.variables]
        self.strategy = strategy
        self.worker_index = info.worker_index
        self.saved = tf.Variable(
            tf.zeros([info.num_workers, sum(self.sizes)], tf.float64),
            trainable=False,
            name="worker_local_values",
        )

        def gather_rows(row: tf.Tensor) -> tf.Tensor:
            # The identity places the row on this replica's device, which the collective needs.
            return tf.distribute.get_replica_context().all_gather(
                tf.identity(row), axis=0, options=collective_options
            )

        # Collectives only, no user code: traced as written, without autograph's conversion
        # (which a function autograph=False runs also leaves out of strategy.run's).
        self._gather = tf.function(
            lambda row: strategy.run(gather_rows, args=(row,)), autograph=False
        )

    def _local(self, variable: tf.Variable) -> tf.Variable:
        return self.strategy.experimental_local_results(variable)[0]

    def gather(self) -> None:
        """Collects every worker's values into `saved`; a collective: every worker calls it."""
        row = tf.concat(
            [tf.reshape(tf.cast(self._local(v), tf.float64), [-1]) for v in self.variables]
            + [tf.zeros([0], tf.float64)],
            axis=0,
        )
        gathered = self._gather(row[tf.newaxis, :])
        self.saved.assign(self.strategy.experimental_local_results(gathered)[0])

    def apply(self, metrics: bool) -> None:
        """Puts this worker's saved values back: the model's, or (`metrics`) the metrics'."""
        pieces = tf.split(self.saved[self.worker_index], self.sizes)
        for variable, piece, is_metric in zip(self.variables, pieces, self.is_metric, strict=True):
            if is_metric == metrics:
                self._local(variable).assign(
                    tf.reshape(tf.cast(piece, variable.dtype), variable.shape)
                )


class Backup:
    """Saves and restores the checkpoint and `state.json` of one worker's run."""

    def __init__(
        self,
        train_dir: str,
        info: cluster.ClusterInfo,
        strategy: tf.distribute.Strategy,
        trackables: dict[str, Any],
        worker_local: WorkerLocalValues,
        collective_options: tf.distribute.experimental.CommunicationOptions,
    ) -> None:
        self.train_dir = train_dir
        self.folder = backup_dir(train_dir)
        self.info = info
        self.strategy = strategy
        self.worker_local = worker_local
        self.checkpoint = tf.train.Checkpoint(**trackables, worker_local=worker_local.saved)
        answer_legacy_saveable_name(worker_local.variables)
        self.faults = _InjectedFaults()

        def any_failed(failed: tf.Tensor) -> tf.Tensor:
            return tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, tf.identity(failed), options=collective_options
            )

        self._any_failed = tf.function(
            lambda failed: strategy.run(any_failed, args=(failed,)), autograph=False
        )

    def restore(self) -> RunState | None:
        """Loads the saved state into the trackables; None when there is no backup."""
        path = layout.join(self.folder, STATE_FILE)
        if not tf.io.gfile.exists(path):
            return None
        state = RunState.from_json(
            artifacts.with_retries(lambda: atomic.read_json(path), f"reading {path}")
        )
        prefix = layout.join(self.folder, state.checkpoint)
        self.checkpoint.read(prefix).assert_existing_objects_matched()
        self.worker_local.apply(metrics=False)  # the metrics once fit has reset them
        log.info(
            "restored backup %s: epoch %d step %d finished=%s",
            state.checkpoint, state.epoch, state.step, state.finished,
        )  # fmt: skip
        return state

    def begin(self, settings: dict[str, Any]) -> None:
        """Records the settings of a run that has no backup yet (chief; before any save)."""
        if cluster.may_write_real_paths(self.info):
            path = layout.join(self.folder, SETTINGS_FILE)
            tf.io.gfile.makedirs(self.folder)
            artifacts.with_retries(
                lambda: atomic.write_json_atomic(path, settings), f"writing {path}"
            )

    def save(self, state: RunState) -> None:
        """Writes a new checkpoint, then `state.json` naming it; every worker must call this.

        Each worker writes the checkpoint to local scratch (the collectives inside a save run
        once, never retried); the chief then copies it to the backup folder and writes
        `state.json`, retrying transient errors. All workers then learn together whether the
        chief succeeded, and fail together if not.

        Raises:
            BackupError: the backup could not be written; the previous one is intact.
        """
        state.saves += 1
        name = f"{CHECKPOINT_PREFIX}-{state.saves}"
        previous, state.checkpoint = state.checkpoint, name
        scratch = cluster.scratch_dir(self.info)
        error: BaseException | None = None
        started = time.perf_counter()
        self.worker_local.gather()
        try:
            self.checkpoint.write(os.path.join(scratch, name))
            size = sum(entry.stat().st_size for entry in os.scandir(scratch))
            if cluster.may_write_real_paths(self.info):
                self._publish(scratch, name, state)
            log.info(
                "backup %s (epoch %d step %d): %d bytes in %.3fs",
                name, state.epoch, state.step, size, time.perf_counter() - started,
            )  # fmt: skip
        except (OSError, tf.errors.OpError) as e:
            error = e
            log.error("writing backup %s failed: %s", name, e)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        failed, disk_full = self._failures_anywhere(error)
        if failed:
            state.checkpoint = previous
            error_type = DiskFullError if disk_full else BackupError
            raise error_type(self._describe(disk_full, error, name, previous))
        if cluster.may_write_real_paths(self.info):
            self._remove_other_checkpoints(name)

    def _publish(self, scratch: str, name: str, state: RunState) -> None:
        files = sorted(os.listdir(scratch), key=lambda f: f.endswith(".index"))  # index last
        for file_name in files:
            source, target = os.path.join(scratch, file_name), layout.join(self.folder, file_name)
            artifacts.with_retries(
                functools.partial(self._copy, source, target, state.saves), f"writing {target}"
            )
        path = layout.join(self.folder, STATE_FILE)
        artifacts.with_retries(functools.partial(self._write_state, path, state), f"writing {path}")

    def _copy(self, source: str, target: str, save_number: int) -> None:
        self.faults.check(save_number)
        atomic.copy_atomic(source, target)

    def _write_state(self, path: str, state: RunState) -> None:
        self.faults.check(state.saves)
        atomic.write_json_atomic(path, state.to_json())

    def _describe(
        self, disk_full: bool, error: BaseException | None, name: str, previous: str
    ) -> str:
        kept = f"the previous backup ({previous}) is intact" if previous else "no backup yet"
        if disk_full:
            return (
                f"no space left on the device of {self.folder} while writing backup {name}: "
                f"free space there and rerun to resume; {kept}"
            )
        detail = str(error) if error is not None else "see worker 0's log"
        return f"could not write backup {name} to {self.folder} ({detail}); {kept}"

    def _failures_anywhere(self, error: BaseException | None) -> tuple[bool, bool]:
        """(any worker failed, any failed for a full disk): the same answer on every worker."""
        disk_full = error is not None and artifacts.is_disk_full(error)
        mine = tf.constant([float(error is not None), float(disk_full)])
        total = self.strategy.experimental_local_results(self._any_failed(mine))[0].numpy()
        return bool(total[0] > 0), bool(total[1] > 0)

    def _remove_other_checkpoints(self, keep: str) -> None:
        for path in tf.io.gfile.glob(layout.join(self.folder, f"{CHECKPOINT_PREFIX}-*")):
            if not os.path.basename(path).startswith(f"{keep}."):
                try:
                    tf.io.gfile.remove(path)
                except (OSError, tf.errors.OpError) as e:  # a leftover is harmless
                    log.warning("could not remove old backup file %s: %s", path, e)

    def remove(self) -> None:
        """Deletes the backup; the chief calls it only once the final files are durable."""
        if cluster.may_write_real_paths(self.info):
            artifacts.remove_backup(self.train_dir)
