"""Luigi task of the train stage: maps its parameters onto `python -m train launch`."""

from __future__ import annotations

import json
import os
import shlex
import sys
import threading

import luigi

from contract import layout
from pipeline import executor
from pipeline.params import RunTask
from pipeline.preprocess_task import Preprocess

STAGE_LOG_FILE = "train.log"
PROGRESS_PREFIX = "PROGRESS "  # the line the chief prints after every epoch
POLL_SECONDS = 2.0


class Train(RunTask):
    """Trains the run's model with `num_workers` workers on the run's shard set."""

    model = luigi.Parameter(default="cnn", description="Model architecture by name (cnn, mlp).")
    epochs = luigi.IntParameter(default=15, description="Most epochs to train (at least 1).")
    per_worker_batch_size = luigi.IntParameter(
        default=256,
        description="Examples per step on each worker; the global batch is this times num_workers.",
    )
    learning_rate = luigi.FloatParameter(default=3e-3, description="Adam's initial learning rate.")
    early_stopping_patience = luigi.IntParameter(
        default=4,
        description="Epochs without a better val_loss before training stops (best weights are "
        "kept); 0 turns early stopping off.",
    )
    reduce_lr_patience = luigi.IntParameter(
        default=2,
        description="Epochs without a better val_loss before the learning rate is halved; 0 off.",
    )
    save_freq_steps = luigi.IntParameter(
        default=100,
        description="Steps between backups under <train>/backup/; a restart loses at most this.",
    )
    scalar_freq_steps = luigi.IntParameter(
        default=50, description="Steps between TensorBoard scalar summaries; 0 for epochs only."
    )
    histogram_freq_steps = luigi.IntParameter(
        default=200,
        description="Steps between TensorBoard histograms of the all-reduced gradients; 0 off.",
    )
    threads_per_worker = luigi.IntParameter(
        default=1, description="TensorFlow threads of each worker process."
    )
    collective_timeout_seconds = luigi.FloatParameter(
        default=60.0,
        description="Seconds a worker waits in the gradient or validation all-reduce for a "
        "vanished peer before failing (each timed collective holds a timer thread this long).",
    )
    max_restarts = luigi.IntParameter(
        default=2,
        description="Times the whole cluster is restarted (resuming from the backup) after a "
        "worker dies, before the task fails.",
    )

    def requires(self) -> luigi.Task:
        return Preprocess(**self.shared_params())

    def output(self) -> luigi.LocalTarget:
        return luigi.LocalTarget(
            layout.join(layout.train_dir(self.output_root, self.date_str), layout.HISTORY_FILE)
        )

    def command(self) -> list[str]:
        """The stage's command line; the docker executor swaps where the workers run."""
        settings = {
            "data_dir": layout.data_dir(self.output_root, self.date_str),
            "train_dir": layout.train_dir(self.output_root, self.date_str),
            "model": self.model,
            "epochs": self.epochs,
            "per_worker_batch_size": self.per_worker_batch_size,
            "learning_rate": repr(self.learning_rate),
            "early_stopping_patience": self.early_stopping_patience,
            "reduce_lr_patience": self.reduce_lr_patience,
            "save_freq_steps": self.save_freq_steps,
            "scalar_freq_steps": self.scalar_freq_steps,
            "histogram_freq_steps": self.histogram_freq_steps,
            "threads_per_worker": self.threads_per_worker,
            "collective_timeout_seconds": repr(self.collective_timeout_seconds),
            "num_workers": self.num_workers,
            "max_restarts": self.max_restarts,
        }
        args = [sys.executable, "-m", "train", "launch"]
        for name, value in settings.items():
            args += [f"--{name.replace('_', '-')}", str(value)]
        return args

    def run(self) -> None:
        logs = layout.logs_dir(self.output_root, self.date_str)
        os.makedirs(logs, exist_ok=True)
        log_path = layout.join(logs, STAGE_LOG_FILE)
        with open(log_path, "ab") as log:
            log.write(f"$ {shlex.join(self.command())}\n".encode())
            log.flush()
            start = log.tell()
            result: list[int] = []
            stage = threading.Thread(
                target=lambda: result.append(executor.call(self.command(), log))
            )
            stage.start()
            while stage.is_alive():
                stage.join(POLL_SECONDS)
                self._report_progress(log_path, start)
        if result != [0]:
            raise RuntimeError(
                f"the train stage exited with {result[0] if result else 'an error'}; "
                f"its log is {log_path}:\n{_error_summary(log_path)}"
            )

    def _report_progress(self, log_path: str, start: int) -> None:
        """Shows the chief's latest PROGRESS line in Luigi (percentage and status message)."""
        latest = None
        with open(log_path, errors="replace") as f:
            f.seek(start)
            for line in f:
                if line.startswith(PROGRESS_PREFIX):
                    latest = line
        if latest is None:
            return
        try:
            progress = json.loads(latest[len(PROGRESS_PREFIX) :])
        except ValueError:
            return
        self.set_progress_percentage(round(100 * progress["epoch"] / progress["epochs"]))
        metrics = ", ".join(
            f"{k} {v:.4f}" for k, v in progress.items() if k not in ("epoch", "epochs")
        )
        self.set_status_message(f"epoch {progress['epoch']}/{progress['epochs']}: {metrics}")


def _error_summary(path: str, lines: int = 20) -> str:
    """The stage's one-line error ("train: ...") when it printed one, else the log's tail."""
    with open(path, errors="replace") as f:
        text = f.readlines()
    errors = [line for line in text if line.startswith("train: ")]
    return errors[-1] if errors else "".join(text[-lines:])
