"""Callbacks around fit: the run record and progress lines, TensorBoard scalars, fault injection."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any

import tensorflow as tf
import tf_keras as keras

from contract.messages import progress_line
from train import cluster, forker
from train.backup import RunState

# Test-only: "<worker>:<point>" makes that worker SIGKILL itself at <point> on the first attempt;
# a comma-separated list of them gives one fault per attempt in turn (the second entry acts on
# the restart after the first kill, and so on). <point> is "<step>" as that global step begins,
# "stage-<step>" the same but killing its whole process group (the launcher and every worker),
# "validated-<epoch>" right after that 1-based epoch's validation (before its backup), or one
# of worker.run's points after training: "trained", "saved" (model and checkpoint written),
# "finished" (history.json written, backup not removed).
FAULT_ENV = "TRAIN_FAULT_KILL_AT_STEP"
# Test-only, cluster.HOLD_ENV: "<step>" makes every worker wait as that global step begins (on
# the first attempt) until the worker gets SIGTERM, or HOLD_SECONDS pass: a run held mid-epoch
# for as long as a test needs, on a machine of any speed. Every worker holds, so none waits in a
# collective. "epoch-<n>" holds as the first step of that 1-based epoch begins.
HOLD_SECONDS = 600.0
# Set by train.preemption when the worker gets SIGTERM: ends a hold.
SIGTERM_SEEN = threading.Event()
HISTORY_KEYS = ("loss", "accuracy", "val_loss", "val_accuracy", "learning_rate")

log = logging.getLogger("train")


def learning_rate(model: keras.Model) -> float:
    return float(keras.backend.get_value(model.optimizer.learning_rate))


def current_step(model: keras.Model) -> int:
    """The global step: optimizer updates so far, restored with the backup."""
    return int(keras.backend.get_value(model.optimizer.iterations))


def fault_point(worker_index: int, attempt: int) -> str:
    """Where FAULT_ENV tells this worker to die on this attempt ("" for nowhere)."""
    plan = os.environ.get(FAULT_ENV, "").split(",")
    if attempt >= len(plan):
        return ""
    worker, _, point = plan[attempt].strip().partition(":")
    return point if point and int(worker) == worker_index else ""


def die_if_at(armed: str, point: str) -> None:
    """SIGKILLs this worker (or, for "stage-" points, its whole process group) at `point`."""
    if not armed or armed != point:
        return
    whole_stage = point.startswith("stage-")
    log.info("FAULT killing %s at %s", "the stage" if whole_stage else "myself", point)
    logging.shutdown()
    if whole_stage:
        launcher = int(os.environ.get(forker.STAGE_GROUP_ENV) or 0)
        if launcher and launcher != os.getpgid(0):  # a forker in a group of its own
            with contextlib.suppress(ProcessLookupError):
                os.killpg(launcher, signal.SIGKILL)
        os.killpg(os.getpgid(0), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


class FaultInjection(keras.callbacks.Callback):
    """Kills this worker at a step or after an epoch's validation, to test exact resume, or
    holds it at a step until SIGTERM, to test what happens to a run stopped mid-epoch.

    Place it right after validation: an epoch-end kill then comes after validation and
    before everything that records the epoch.
    """

    def __init__(self, worker_index: int, attempt: int) -> None:
        super().__init__()
        self._supports_tf_logs = True
        self.point = fault_point(worker_index, attempt)
        hold = os.environ.get(cluster.HOLD_ENV, "") if attempt == 0 else ""
        self.hold_at_epoch = int(hold.removeprefix("epoch-")) if hold.startswith("epoch-") else None
        self.hold_at = int(hold) if hold and self.hold_at_epoch is None else None
        self.epoch_begun: int | None = None  # the 1-based epoch whose first step is next

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.epoch_begun = epoch + 1

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        first_of, self.epoch_begun = self.epoch_begun, None
        if not (self.point or self.hold_at is not None or self.hold_at_epoch is not None):
            return
        step = current_step(self.model)
        if self.point:
            die_if_at(self.point, str(step))
            die_if_at(self.point, f"stage-{step}")
        if step == self.hold_at or (first_of is not None and first_of == self.hold_at_epoch):
            log.info("%s %d until SIGTERM", cluster.HOLDING, step)
            for handler in log.handlers + logging.getLogger().handlers:
                handler.flush()
            SIGTERM_SEEN.wait(HOLD_SECONDS)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        die_if_at(self.point, f"validated-{epoch + 1}")


class _StepCounter(keras.callbacks.Callback):
    """Knows the global step at each batch's end without reading the optimizer every step:
    reads it once, at the first batch (after the backup has restored it), then counts."""

    def __init__(self, freq_steps: int) -> None:
        super().__init__()
        self.freq_steps = freq_steps
        self._step: int | None = None

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._step is None:
            self._step = current_step(self.model)

    def _finished_step(self) -> tuple[int, bool]:
        """Counts the step that just ended: (its global step, whether `freq_steps` is due)."""
        assert self._step is not None
        self._step += 1
        return self._step, self.freq_steps > 0 and self._step % self.freq_steps == 0


class TrainMetrics(_StepCounter):
    """Puts the training loss and accuracy of all workers into the logs when they are read:
    at every epoch's end and every `freq_steps` steps (for TensorBoard's step scalars).

    The train step only adds to each worker's running sums; reading a metric here sums
    them across workers (collectives), so every worker must run this callback at the same
    steps, before anything that reads the training metrics from the logs.
    """

    def __init__(self, freq_steps: int) -> None:
        super().__init__(freq_steps)
        self._supports_tf_logs = True  # fills the logs in; reads nothing from them per step
        self._results: Any = None

    def _read(self, logs: dict[str, Any] | None) -> None:
        if logs is None:
            return
        if self._results is None:
            # Traced once: read eagerly, each metric variable's sum across the workers is a
            # collective that TensorFlow runs from a thread pool it makes and drops each time.
            metrics = list(self.model.metrics)
            self._results = tf.function(
                lambda: {m.name: m.result() for m in metrics}, autograph=False
            )
        logs.update({name: float(value) for name, value in self._results().items()})

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        _, due = self._finished_step()
        if due:
            self._read(logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._read(logs)


class LearningRateLog(keras.callbacks.Callback):
    """Records the epoch's learning rate; place it before ReduceLROnPlateau changes it."""

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs["learning_rate"] = learning_rate(self.model)


class RunRecorder(keras.callbacks.Callback):
    """Logs where this attempt started and how many steps it ran; keeps every epoch's metrics.

    The metrics live in the run state, saved with the backup, so a resumed run still reports
    the epochs trained before the restart. The chief prints one progress line per epoch.
    """

    def __init__(self, state: RunState, chief: bool, epochs: int, global_batch_size: int) -> None:
        super().__init__()
        self._supports_tf_logs = True  # its batch hooks never read the logs: no per-step sync
        self.state = state
        self.chief = chief
        self.epochs = epochs
        self.global_batch_size = global_batch_size
        self.train_ended_at = time.perf_counter()
        self.fit_return_seconds: float | None = None  # None when the backup held a finished run
        self.initial_epoch: int | None = None
        self.initial_step: int | None = None
        self.steps_executed = 0
        self._epoch_started = 0.0
        self._epoch_steps = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch_started = time.perf_counter()
        self._epoch_steps = 0
        if self.initial_epoch is None:
            self.initial_epoch = epoch

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
        seconds = time.perf_counter() - self._epoch_started
        first = 1.0 if epoch == self.initial_epoch else 0.0
        self.state.epoch_timings[epoch] = [float(self._epoch_steps), seconds, first]

    def epoch_end_hook(self) -> keras.callbacks.Callback:
        """The callback that records each epoch; place it last, after validation."""
        return _EpochEndHook(self)

    def record_epoch(self, epoch: int, logs: dict[str, Any] | None) -> None:
        values = {k: float(v) for k, v in (logs or {}).items() if k in HISTORY_KEYS}
        self.state.epoch_logs[epoch] = values
        if self.chief:
            steps, seconds, _ = self.state.epoch_timings.get(epoch, [0.0, 0.0, 0.0])
            rate = steps * self.global_batch_size / seconds if seconds > 0 else 0.0
            progress = {"epoch": epoch + 1, "epochs": self.epochs, **values}
            print(progress_line({**progress, "examples_per_second": rate}), flush=True)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.train_ended_at = time.perf_counter()
        log.info(
            "END steps_executed=%d final_step=%d",
            self.steps_executed,
            current_step(self.model),
        )

    def history(self) -> dict[str, list[float]]:
        logs = self.state.epoch_logs
        ordered = [logs[k] for k in sorted(logs)]
        return {key: [e[key] for e in ordered if key in e] for key in HISTORY_KEYS}

    def examples_per_second(self) -> float:
        """Training throughput of the run, restarts included: all workers together, validation
        excluded.

        Each attempt's first epoch (graph tracing, collective set-up) is left out when there
        are other epochs.
        """
        timings = list(self.state.epoch_timings.values())
        timings = [t for t in timings if not t[2]] or timings
        seconds = sum(t[1] for t in timings)
        if seconds <= 0:
            return 0.0
        return sum(t[0] for t in timings) * self.global_batch_size / seconds


class _EpochEndHook(keras.callbacks.Callback):
    def __init__(self, recorder: RunRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.recorder.record_epoch(epoch, logs)


class ChiefTensorBoard(_StepCounter):
    """Writes scalars every `freq_steps` steps and at every epoch end (chief only)."""

    def __init__(self, writer: tf.summary.SummaryWriter, freq_steps: int) -> None:
        super().__init__(freq_steps)
        self._supports_tf_logs = True  # read the logs only when due, not every step
        self.writer = writer

    def _write(self, prefix: str, values: dict[str, Any], step: int) -> None:
        with self.writer.as_default():
            for name, value in values.items():
                tf.summary.scalar(f"{prefix}/{name}", float(value), step=step)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        step, due = self._finished_step()
        if due:
            values = {k: v for k, v in (logs or {}).items() if k in HISTORY_KEYS}
            values["learning_rate"] = learning_rate(self.model)
            self._write("step", values, step)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        values = {k: v for k, v in (logs or {}).items() if k in HISTORY_KEYS}
        self._write("epoch", values, epoch + 1)
        self.writer.flush()
