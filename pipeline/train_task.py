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
from pipeline.stage_params import stage_flags, stage_parameters
from pipeline.targets import GFileTarget
from train.config import MAX_RESTARTS, WARM_START_SETTLED, TrainConfig

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


@stage_parameters(
    TrainConfig,
    # The run's folders (from output_root and date), and what the launcher settles itself.
    skip=("data_dir", "train_dir", *WARM_START_SETTLED),
    fallbacks={"seed": {"section": "Preprocess", "name": "seed"}},
)
class Train(RunTask):
    """Trains the run's model with `num_workers` workers on the run's shard set.

    Every setting of train.config.TrainConfig is a parameter of this task too (same name,
    type, choices, description and default); luigi.cfg's [Train] gives the nightly recipe.
    """

    model: str  # a parameter from TrainConfig, named here for the type checker

    max_restarts = luigi.IntParameter(
        default=MAX_RESTARTS,
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

    def check_complete(self) -> bool:
        # luigi asks before it schedules anything: a model by import path whose module or
        # function is missing stops the run here, in the train stage's words, before Preprocess.
        # A finished run counts only for the parameters it was trained with.
        done = super().check_complete()
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
        args = [sys.executable, "-m", "train", "launch"]
        args += ["--data-dir", layout.data_dir(self.output_root, self.date_str)]
        args += ["--train-dir", layout.train_dir(self.output_root, self.date_str)]
        args += stage_flags(self)
        args += ["--num-workers", str(self.num_workers), "--max-restarts", str(self.max_restarts)]
        return args + config.train_backend_flags()

    def run(self) -> None:
        self.hold_run_lock()
        logs = layout.logs_dir(self.output_root, self.date_str)
        runner.run_stage(self, "train", self.command(), layout.join(logs, STAGE_LOG_FILE))
