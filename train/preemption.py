"""Pre-emption: on SIGTERM every worker takes part in one last backup, then the worker exits.

A save under MultiWorkerMirroredStrategy is a collective: every worker must call it at the
same step, or the cluster hangs. SIGTERM reaches the workers at different moments (or only
one of them), so they first agree on the step, the way TensorFlow's
PreemptionCheckpointHandler does, through the coordination service's key-value store:

1. the first worker to see its SIGTERM at a batch's end, having finished global step S,
   claims the pre-emption and publishes S + 1 as the step to save at;
2. every worker's watcher thread picks the step up and acknowledges it; the claimant waits
   for every acknowledgement before it trains step S + 1. No worker can finish S + 1
   without the claimant, so every worker knows the step before it gets there;
3. after step S + 1 each worker saves the backup (an epoch's last step waits for that
   epoch's end, as every backup does), says so in the store and waits for the others' word
   (a peer exiting the moment its save's last collective returned could cut a transfer the
   other still needed), then exits with 143, as a SIGTERMed process would.

A worker that cannot finish this within SAVE_SECONDS (stuck in a collective whose peer has
gone, say) exits with 143 anyway; outside fit (starting, writing the final files) SIGTERM ends
the worker at once, as it did before.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

import tensorflow as tf
import tf_keras as keras
from tensorflow.python.eager import context

from contract.messages import EXIT_PREEMPTED
from train import callbacks, cluster
from train.backup import Backup, RunState
from train.callbacks import current_step

# Within the launcher's grace period (train.restarts.STOP_GRACE_SECONDS, 10 s) and a pod's
# (30 s by default); also how long a worker stuck in a collective lingers after SIGTERM.
SAVE_SECONDS = 8.0
ACK_SECONDS = 3.0
POLL_MS = 500
CLAIM_KEY = "nightly_trainer/preemption/claimed_by"
STEP_KEY = "nightly_trainer/preemption/save_at_step"
ACK_KEY = "nightly_trainer/preemption/ack/{worker}"
SAVED_KEY = "nightly_trainer/preemption/saved/{worker}"

log = logging.getLogger("train")


def _exit_preempted(why: str) -> None:
    log.warning("exiting after SIGTERM: %s", why)
    for handler in logging.getLogger().handlers + log.handlers:
        handler.flush()
    os._exit(EXIT_PREEMPTED)


class SaveOnPreemption(keras.callbacks.Callback):
    """Saves the backup at the step the cluster agrees on after a SIGTERM, then exits.

    Place it after `resumable.BackupSchedule`, so that an epoch's end sees whether that
    schedule has saved the same position already.
    """

    def __init__(
        self,
        backup: Backup,
        state: RunState,
        info: cluster.ClusterInfo,
        steps_per_epoch: int,
    ) -> None:
        super().__init__()
        self._supports_tf_logs = True  # reads no logs: no per-step sync
        self.backup = backup
        self.state = state
        self.info = info
        self.steps_per_epoch = steps_per_epoch
        self.signalled = threading.Event()
        self.training = False
        self.claim_tried = False
        self.save_at: int | None = None
        self.save_at_epoch_end = False
        self._stop_watching = threading.Event()
        self._epoch = state.epoch
        self._previous_handler: Any = None
        self._wakeup_read = -1
        self._wakeup_write = -1

    # --- the signal -------------------------------------------------------------------------

    def _install(self) -> None:
        """Notes SIGTERM at once, even while the main thread waits in TensorFlow: the signal's
        wakeup byte goes to a pipe a thread reads, not only to Python's main-thread handler."""
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._wakeup_read, self._wakeup_write = read, write
        self._previous_handler = signal.signal(signal.SIGTERM, lambda *_: None)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        threading.Thread(target=self._on_signal, name="sigterm", daemon=True).start()

    def _uninstall(self) -> None:
        """Gives SIGTERM back its earlier handling (ending the worker at once)."""
        if self._wakeup_write < 0:
            return
        signal.signal(signal.SIGTERM, self._previous_handler)  # first: no signal goes unseen
        signal.set_wakeup_fd(-1)
        os.close(self._wakeup_write)  # the thread reads the end of the pipe and stops
        self._wakeup_write = -1

    def _on_signal(self) -> None:
        while True:
            try:
                data = os.read(self._wakeup_read, 64)
            except OSError:
                return
            if not data:
                os.close(self._wakeup_read)
                return
            if signal.SIGTERM not in data:
                continue
            if not self.training:
                _exit_preempted("not training: nothing to save")
            if not self.signalled.is_set():
                log.warning("SIGTERM: saving a backup at a step the cluster agrees on")
                self.signalled.set()
                callbacks.SIGTERM_SEEN.set()
                timer = threading.Timer(
                    SAVE_SECONDS, _exit_preempted, args=("the backup took too long",)
                )
                timer.daemon = True
                timer.start()

    # --- agreeing on the step ---------------------------------------------------------------

    def _watch_step(self) -> None:
        """Learns the step to save at from the coordination service and acknowledges it."""
        while not self._stop_watching.is_set():
            try:
                value = context.context().get_config_key_value(STEP_KEY, POLL_MS)
            except tf.errors.OpError:
                continue  # not set yet (or the service is going away)
            self.save_at = int(value)
            try:
                context.context().set_config_key_value(
                    ACK_KEY.format(worker=self.info.worker_index), "1"
                )
            except tf.errors.OpError as e:
                log.warning("could not acknowledge the pre-emption step: %s", e)
            return

    def _claim(self, step: int) -> None:
        """Publishes `step` + 1 as the step to save at, if no other worker did first."""
        self.claim_tried = True
        if self.info.num_workers < 2:
            self.save_at = step
            return
        try:
            context.context().set_config_key_value(CLAIM_KEY, str(self.info.worker_index))
            context.context().set_config_key_value(STEP_KEY, str(step + 1))
        except tf.errors.AlreadyExistsError:
            return  # another worker saw its SIGTERM first; its step comes through _watch_step
        except tf.errors.OpError as e:  # the service (the chief) is gone: no save can be made
            _exit_preempted(f"the cluster cannot agree on a step to save at ({e.message})")
        log.info("pre-emption: every worker saves after global step %d", step + 1)
        for worker in range(self.info.num_workers):
            try:
                context.context().get_config_key_value(
                    ACK_KEY.format(worker=worker), int(ACK_SECONDS * 1000)
                )
            except tf.errors.OpError:
                _exit_preempted(f"worker {worker} did not acknowledge the pre-emption step")

    # --- the callback -----------------------------------------------------------------------

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if threading.current_thread() is threading.main_thread():
            self._install()
        if self.info.num_workers > 1:
            threading.Thread(target=self._watch_step, name="preemption", daemon=True).start()
        self.training = True

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.save_at is None and not self.signalled.is_set():
            return  # the common case: no step read, no sync
        if self.save_at is None and not self.claim_tried:
            self._claim(current_step(self.model))
        if self.save_at is None or current_step(self.model) != self.save_at:
            return
        if batch + 1 < self.steps_per_epoch:
            self._save_and_exit(self._epoch, batch + 1)
        else:
            self.save_at_epoch_end = True  # a backup never holds an epoch half-ended

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.save_at_epoch_end:
            self._save_and_exit(epoch + 1, 0)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.training = False
        self._stop_watching.set()
        if self.signalled.is_set():
            _exit_preempted("training had ended; its last backup is on disk")
        if threading.current_thread() is threading.main_thread():
            self._uninstall()

    def _save_and_exit(self, epoch: int, step: int) -> None:
        if (self.state.epoch, self.state.step) != (epoch, step):  # else just saved there
            self.state.epoch, self.state.step = epoch, step
            self.backup.save(self.state)
        self._wait_for_peers()
        _exit_preempted(f"backup {self.state.checkpoint} holds epoch {epoch} step {step}")

    def _wait_for_peers(self) -> None:
        """Returns once every worker is past the save's last collective.

        A collective can end on one worker while a peer still receives that worker's part of
        it; a worker that exited at once would cut the peer's transfer, and the peer would
        fail instead of exiting after its backup. So each worker says it is done and waits for
        the others' word. A peer or coordination service already gone ended its part too.
        """
        if self.info.num_workers < 2:
            return
        coordination = context.context()
        try:
            coordination.set_config_key_value(SAVED_KEY.format(worker=self.info.worker_index), "1")
            for worker in range(self.info.num_workers):
                if worker != self.info.worker_index:
                    coordination.get_config_key_value(
                        SAVED_KEY.format(worker=worker), int(ACK_SECONDS * 1000)
                    )
        except tf.errors.OpError as e:
            log.info("pre-emption: not every peer said it saved (%s)", e.message)
