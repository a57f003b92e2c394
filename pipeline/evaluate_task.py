"""Luigi task of the evaluate stage: `python -m evaluate` for the night's run."""

from __future__ import annotations

import sys

import luigi

from evaluate.config import EvaluateConfig
from pipeline import terminal
from pipeline.stage_task import StageSpec, StageTask, stage_task
from pipeline.train_task import Train

SPEC = StageSpec(
    name="evaluate",
    module=("evaluate",),
    config_class=EvaluateConfig,
    output=lambda run: run.metrics_path,
    log_file="evaluate.log",
    run_settings=("output_root", "date", "dataset"),
)


@stage_task(SPEC)
class Evaluate(StageTask):
    """Scores the run's final model on the whole eval split, writes the report, blesses or not.

    Every setting of evaluate.config.EvaluateConfig but the run's own is a parameter here too.
    """

    def requires(self) -> luigi.Task:
        return Train(**self.shared_params())

    def after_stage(self) -> None:
        line = terminal.evaluation_line(self.run_value.evaluate_dir)
        print(f"[evaluate] {line}", file=sys.stderr, flush=True)
