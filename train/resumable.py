"""Callbacks whose state survives a restart: best epoch, early stopping, plateau, and the backup.

Each keeps what decides its next move in the shared `RunState`, which `BackupSchedule` saves
with every checkpoint; after a restore they carry on exactly where the saved run was.
"""

from __future__ import annotations

from typing import Any

import tf_keras as keras

from train.backup import Backup, BestWeights, RunState, WorkerLocalValues
from train.callbacks import current_step

MONITOR = "val_loss"


class BestEpoch(keras.callbacks.Callback):
    """Keeps the weights of the epoch with the lowest val_loss of the whole run.

    Place it after validation. Ties keep the earlier epoch, as `artifacts.best_epoch` does.
    """

    def __init__(self, state: RunState, best_weights: BestWeights, core: keras.Model) -> None:
        super().__init__()
        self.state = state
        self.best_weights = best_weights
        self.core = core  # the exported model, whose weights the trainer trains

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        value = (logs or {}).get(MONITOR)
        if value is not None and float(value) < self.state.best_val_loss:
            self.state.best_val_loss = float(value)
            self.state.best_epoch = epoch
            self.best_weights.capture(self.core)


class ResumableEarlyStopping(keras.callbacks.EarlyStopping):
    """EarlyStopping on val_loss whose patience and best value are restored on resume.

    The weights it would restore come from `BestEpoch` instead (restore_best_weights off).
    """

    def __init__(self, state: RunState, patience: int) -> None:
        super().__init__(monitor=MONITOR, patience=patience, restore_best_weights=False)
        self.state = state

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        super().on_train_begin(logs)
        saved = self.state.early_stopping
        if saved:  # a resumed run: carry on from the saved epoch's end
            self.wait = int(saved["wait"])
            self.best = float(saved["best"])
            self.stopped_epoch = int(saved["stopped_epoch"])

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        self.state.early_stopping = {
            "wait": self.wait,
            "best": float(self.best),
            "stopped_epoch": self.stopped_epoch,
        }


class ResumablePlateau(keras.callbacks.ReduceLROnPlateau):
    """ReduceLROnPlateau on val_loss whose patience, best and cooldown are restored on resume.

    The learning rate itself is an optimizer variable, restored with the checkpoint.
    """

    def __init__(self, state: RunState, patience: int, factor: float) -> None:
        super().__init__(monitor=MONITOR, factor=factor, patience=patience)
        self.state = state

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        super().on_train_begin(logs)
        saved = self.state.plateau
        if saved:
            self.wait = int(saved["wait"])
            self.best = float(saved["best"])
            self.cooldown_counter = int(saved["cooldown_counter"])

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        self.state.plateau = {
            "wait": self.wait,
            "best": float(self.best),
            "cooldown_counter": self.cooldown_counter,
        }


class BackupSchedule(keras.callbacks.Callback):
    """Saves the backup every `save_freq_steps` global steps and when training finishes.

    Place it last: a save at an epoch's end then holds that epoch's validation, early
    stopping, plateau and metrics. A save due at an epoch's last batch waits for that end,
    so a saved position is always a batch to train next, never an epoch half-ended.
    """

    def __init__(
        self,
        backup: Backup,
        state: RunState,
        steps_per_epoch: int,
        epochs: int,
        save_freq_steps: int,
    ) -> None:
        super().__init__()
        self._supports_tf_logs = True  # its batch hooks never read the logs: no per-step sync
        self.backup = backup
        self.state = state
        self.steps_per_epoch = steps_per_epoch
        self.epochs = epochs
        self.save_freq_steps = save_freq_steps
        self._epoch = state.epoch
        self._due = False

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        self._due = False

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if current_step(self.model) % self.save_freq_steps != 0:
            return
        if batch + 1 < self.steps_per_epoch:
            self._save(self._epoch, batch + 1)
        else:
            self._due = True

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        finished = bool(self.model.stop_training) or epoch + 1 >= self.epochs
        if self._due or finished:
            self.state.finished = finished
            self._save(epoch + 1, 0)
        self._due = False

    def _save(self, epoch: int, step: int) -> None:
        self.state.epoch, self.state.step = epoch, step
        self.backup.save(self.state)


class RestoreRunningMetrics(keras.callbacks.Callback):
    """Puts back each worker's running metric sums when fit resumes mid-epoch.

    Fit resets the metrics as every epoch begins; an epoch resumed at step S must instead
    go on from the sums of its first S steps, so its reported loss and accuracy match.
    """

    def __init__(self, worker_local: WorkerLocalValues, start_step: int) -> None:
        super().__init__()
        self.worker_local = worker_local
        self.pending = start_step > 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.pending:
            self.worker_local.apply(metrics=True)
            self.pending = False
