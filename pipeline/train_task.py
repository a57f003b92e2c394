"""Luigi task of the train stage: `python -m train launch` for the night's run."""

from __future__ import annotations

import sys

import luigi

from contract import import_path
from contract.messages import error_line
from pipeline import config
from pipeline.data_gate_task import DataGate
from pipeline.finished_settings import check_train_settings
from pipeline.stage_task import StageSpec, StageTask, stage_task
from train.config import MAX_RESTARTS, WARM_START_SETTLED, TrainConfig

SPEC = StageSpec(
    name="train",
    module=("train", "launch"),
    config_class=TrainConfig,
    output=lambda run: run.history_path,
    log_file="train.log",
    run_settings=("output_root", "date", "data_dir", "train_dir"),
    # The launcher itself always runs here: with [Executor] kind = docker it is given
    # `--backend docker --image ...` (from [Docker]) and runs one container per worker.
    in_container=False,
    skip=WARM_START_SETTLED,  # what the launcher settles itself
    fallbacks={"seed": {"section": "Preprocess", "name": "seed"}},
)


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


@stage_task(SPEC)
class Train(StageTask):
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

    def check_own_parameters(self) -> None:
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
            check_train_settings(self)
        return done

    def extra_args(self) -> list[str]:
        args = ["--num-workers", str(self.num_workers), "--max-restarts", str(self.max_restarts)]
        return args + config.train_backend_flags()
