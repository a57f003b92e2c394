"""Luigi task of the train stage: maps its parameters onto `python -m train launch`."""

from __future__ import annotations

import dataclasses
import sys

import luigi

from contract import import_path, layout
from contract.messages import error_line
from pipeline import config, runner
from pipeline.data_gate_task import DataGate
from pipeline.params import RunTask, plain_value
from pipeline.targets import GFileTarget
from train.config import TrainConfig

STAGE_LOG_FILE = "train.log"


def check_model(model: str) -> None:
    """Refuses a model given by import path whose module or function is missing, before
    anything is scheduled; the module is found and read, not run (the train stage imports and
    builds it once more before any worker starts).

    Raises:
        ImportPathError: printed first as the stages' one error line.
    """
    if not import_path.is_import_path(model):
        return  # a built-in name: the train stage knows them
    try:
        import_path.check(model)
    except import_path.ImportPathError as e:
        print(error_line(str(e)), file=sys.stderr, flush=True)
        raise


class Train(RunTask):
    """Trains the run's model with `num_workers` workers on the run's shard set."""

    model = luigi.Parameter(
        default="cnn",
        description="A built-in model by name (cnn, cnn2, cnn3, mlp), or your own model "
        "function by import path, package.module:function (docs/extending.md).",
    )
    hparams: luigi.DictParameter = luigi.DictParameter(
        default={},
        description="Hyperparameters handed to a model given by import path (and its optimizer "
        """and loss hooks), as JSON: '{"width": 64}'. Built-in models take none.""",
    )
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
    seed = luigi.IntParameter(
        default=0,
        config_path={"section": "Preprocess", "name": "seed"},
        description="Seeds weight initialisation, the input order and dropout: the same seed, "
        "worker count and machine give the same model. Falls back to [Preprocess] seed.",
    )
    augment = luigi.ChoiceParameter(
        default="off",
        choices=["off", "flip-shift"],
        description="On-the-fly augmentation of training batches (seeded; validation and "
        "evaluation never): random horizontal flips and shifts of up to 2 pixels.",
    )
    lr_schedule = luigi.ChoiceParameter(
        default="plateau",
        choices=["plateau", "cosine"],
        description="plateau: halve the rate when val_loss stalls; cosine: warm up over "
        "warmup_epochs, then decay to 0 at the last epoch.",
    )
    warmup_epochs = luigi.IntParameter(default=0, description="Warm-up epochs of cosine.")
    label_smoothing = luigi.FloatParameter(
        default=0.0, description="Label smoothing of the training loss, in [0, 1)."
    )
    test_time_augment = luigi.ChoiceParameter(
        default="off",
        choices=["off", "flip"],
        description="flip: the exported model averages its probabilities on each image and on "
        "its left-right mirror; validation scores that model, so the best epoch is chosen on it.",
    )
    precision = luigi.ChoiceParameter(
        default="float32",
        choices=["float32", "mixed_bfloat16", "auto"],
        description="Keras dtype policy: mixed_bfloat16 computes in bfloat16 with float32 "
        "variables and softmax (faster where the CPU has AMX, or on a recent GPU); auto: "
        "mixed_bfloat16 where the CPU reports AMX-BF16, float32 elsewhere.",
    )
    warm_start = luigi.ChoiceParameter(
        default="off",
        choices=["off", "last-blessed"],
        description="off: fresh weights each night; last-blessed: start from the model the "
        "latest pointer names, or cold (logged, recorded in history.json) on the first night, "
        "when it is missing, fails its sha256 or does not fit the model and input.",
    )
    warm_start_learning_rate = luigi.FloatParameter(
        default=0.0,
        description="The (peak) learning rate of a night that starts warm; 0: learning_rate.",
    )
    max_restarts = luigi.IntParameter(
        default=2,
        description="Times the whole cluster is restarted (resuming from the backup) after a "
        "worker dies, before the task fails.",
    )

    def check_parameters(self) -> None:
        # The stage's own checks, on the settings this task passes it (TrainConfig.check).
        settings = {
            f.name: plain_value(getattr(self, f.name))
            for f in dataclasses.fields(TrainConfig)
            if f.name in self.param_kwargs
        }
        data_dir = layout.data_dir(self.output_root, self.date_str)
        train_dir = layout.train_dir(self.output_root, self.date_str)
        TrainConfig(**{**settings, "data_dir": data_dir, "train_dir": train_dir}).check()
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be 0 or more, got {self.max_restarts}")

    def requires(self) -> luigi.Task:
        # The shard set, once the data gate has let it through.
        return DataGate(**self.shared_params())

    def complete(self) -> bool:
        # luigi asks before it schedules anything: a model by import path whose module or
        # function is missing stops the run here, in the train stage's words, before Preprocess.
        # A finished run counts only for the parameters it was trained with.
        done = bool(super().complete())
        if not done:
            check_model(self.model)
        else:
            from pipeline.full_run import check_train_settings

            check_train_settings(self)
        return done

    def output(self) -> GFileTarget:
        return GFileTarget(
            layout.join(layout.train_dir(self.output_root, self.date_str), layout.HISTORY_FILE)
        )

    def command(self) -> list[str]:
        """The stage's command line; with `[Executor] kind = docker` its workers are containers.

        The launcher itself always runs here: `--backend docker --image ...` (from [Docker])
        makes it start one container per worker.
        """
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
            "seed": self.seed,
            "augment": self.augment,
            "lr_schedule": self.lr_schedule,
            "warmup_epochs": self.warmup_epochs,
            "label_smoothing": repr(self.label_smoothing),
            "test_time_augment": self.test_time_augment,
            "precision": self.precision,
            "warm_start": self.warm_start,
            "warm_start_learning_rate": repr(self.warm_start_learning_rate),
            "num_workers": self.num_workers,
            "max_restarts": self.max_restarts,
            "hparams": luigi.DictParameter().serialize(self.hparams),
        }
        args = [sys.executable, "-m", "train", "launch"]
        for name, value in settings.items():
            args += [f"--{name.replace('_', '-')}", str(value)]
        return args + config.train_backend_flags()

    def run(self) -> None:
        self.hold_run_lock()
        logs = layout.logs_dir(self.output_root, self.date_str)
        runner.run_stage(self, "train", self.command(), layout.join(logs, STAGE_LOG_FILE))
