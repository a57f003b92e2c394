"""Callbacks around fit: the run record and progress lines, TensorBoard scalars, fault injection."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from typing import Any

import tensorflow as tf
import tf_keras as keras

from contract import atomic
from train import summaries

# Test-only: "<worker>:<step>" makes that worker SIGKILL itself at that global step, first attempt.
FAULT_ENV = "TRAIN_FAULT_KILL_AT_STEP"
PROGRESS_PREFIX = "PROGRESS "
HISTORY_KEYS = ("loss", "accuracy", "val_loss", "val_accuracy", "learning_rate")

log = logging.getLogger("train")


def learning_rate(model: keras.Model) -> float:
    return float(keras.backend.get_value(model.optimizer.learning_rate))


def current_step(model: keras.Model) -> int:
    """The global step: optimizer updates so far, restored with the backup."""
    return int(keras.backend.get_value(model.optimizer.iterations))


class FaultInjection(keras.callbacks.Callback):
    """Kills this worker at a given step on the first attempt, to test cluster restarts."""

    def __init__(self, worker_index: int, attempt: int) -> None:
        super().__init__()
        self._supports_tf_logs = True
        spec = os.environ.get(FAULT_ENV, "")
        worker, _, step = spec.partition(":")
        armed = bool(spec) and attempt == 0 and int(worker) == worker_index
        self.kill_at_step = int(step) if armed else -1

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.kill_at_step >= 0 and current_step(self.model) == self.kill_at_step:
            log.info("FAULT killing myself at step %d", self.kill_at_step)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)


class LearningRateLog(keras.callbacks.Callback):
    """Records the epoch's learning rate; place it before ReduceLROnPlateau changes it."""

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs["learning_rate"] = learning_rate(self.model)


class RunRecorder(keras.callbacks.Callback):
    """Logs where this attempt started and how many steps it ran; keeps every epoch's metrics.

    The chief persists the per-epoch metrics to `epochs_path` so a resumed run still reports
    the epochs trained before the restart, and prints one PROGRESS line per epoch.
    """

    def __init__(self, epochs_path: str | None, epochs: int, global_batch_size: int) -> None:
        super().__init__()
        self._supports_tf_logs = True  # its batch hooks never read the logs: no per-step sync
        self.epochs_path = epochs_path
        self.epochs = epochs
        self.global_batch_size = global_batch_size
        self.epoch_logs: dict[int, dict[str, float]] = {}
        if epochs_path and tf.io.gfile.exists(epochs_path):
            saved = atomic.read_json(epochs_path)
            self.epoch_logs = {int(k): v for k, v in saved.items()}
        self.initial_epoch: int | None = None
        self.initial_step: int | None = None
        self.steps_executed = 0
        # (steps, seconds) of each epoch's training steps, validation excluded.
        self.epoch_timings: list[tuple[int, float]] = []
        self._epoch_started = 0.0
        self._epoch_steps = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch_started = time.perf_counter()
        self._epoch_steps = 0
        if self.initial_epoch is None:
            self.initial_epoch = epoch
            # Epochs at or after the restored one will be trained again.
            self.epoch_logs = {k: v for k, v in self.epoch_logs.items() if k < epoch}

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.initial_step is None:
            self.initial_step = current_step(self.model)
            log.info(
                "START initial_epoch=%d initial_step=%d", self.initial_epoch, self.initial_step
            )

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.steps_executed += 1
        self._epoch_steps += 1

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        # First in the callback list: the epoch's steps are done, validation has not begun.
        self.epoch_timings.append((self._epoch_steps, time.perf_counter() - self._epoch_started))

    def epoch_end_hook(self) -> keras.callbacks.Callback:
        """The callback that records each epoch; place it last, after validation."""
        return _EpochEndHook(self)

    def record_epoch(self, epoch: int, logs: dict[str, Any] | None) -> None:
        values = {k: float(v) for k, v in (logs or {}).items() if k in HISTORY_KEYS}
        self.epoch_logs[epoch] = values
        if self.epochs_path:
            atomic.write_json_atomic(self.epochs_path, self.epoch_logs)
            progress = {"epoch": epoch + 1, "epochs": self.epochs, **values}
            print(PROGRESS_PREFIX + json.dumps(progress), flush=True)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        log.info(
            "END steps_executed=%d final_step=%d",
            self.steps_executed,
            current_step(self.model),
        )

    def history(self) -> dict[str, list[float]]:
        ordered = [self.epoch_logs[k] for k in sorted(self.epoch_logs)]
        return {key: [e[key] for e in ordered if key in e] for key in HISTORY_KEYS}

    def examples_per_second(self) -> float:
        """Training throughput of this attempt, all workers together, validation excluded.

        The attempt's first epoch (graph tracing, collective set-up) is left out when there
        are later ones.
        """
        timings = self.epoch_timings[1:] or self.epoch_timings
        seconds = sum(s for _, s in timings)
        if seconds <= 0:
            return 0.0
        return sum(n for n, _ in timings) * self.global_batch_size / seconds


class _EpochEndHook(keras.callbacks.Callback):
    def __init__(self, recorder: RunRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.recorder.record_epoch(epoch, logs)


class ChiefTensorBoard(keras.callbacks.Callback):
    """Writes scalars every `freq_steps` steps and at every epoch end (chief only)."""

    def __init__(self, writer: tf.summary.SummaryWriter, freq_steps: int) -> None:
        super().__init__()
        self._supports_tf_logs = True  # read the logs only when due, not every step
        self.writer = writer
        self.freq_steps = freq_steps
        self._step: int | None = None

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._step is None:  # once, after BackupAndRestore has restored the step
            self._step = current_step(self.model)

    def _write(self, prefix: str, values: dict[str, Any], step: int) -> None:
        with self.writer.as_default():
            for name, value in values.items():
                summaries.scalar(f"{prefix}/{name}", float(value), step=step)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        assert self._step is not None
        self._step += 1
        step = self._step
        if self.freq_steps > 0 and step % self.freq_steps == 0:
            values = {k: v for k, v in (logs or {}).items() if k in HISTORY_KEYS}
            values["learning_rate"] = learning_rate(self.model)
            self._write("step", values, step)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        values = {k: v for k, v in (logs or {}).items() if k in HISTORY_KEYS}
        self._write("epoch", values, epoch + 1)
        self.writer.flush()
