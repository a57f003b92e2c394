"""Luigi task of the evaluate stage: maps its parameters onto `python -m evaluate`."""

from __future__ import annotations

import sys

import luigi

from contract import layout
from evaluate.__main__ import parse_args
from evaluate.config import EvaluateConfig
from pipeline import config, runner, terminal
from pipeline.params import RunTask
from pipeline.stage_params import stage_flags, stage_parameters
from pipeline.targets import GFileTarget
from pipeline.train_task import Train

STAGE_LOG_FILE = "evaluate.log"


@stage_parameters(
    EvaluateConfig,
    skip=("output_root", "date", "dataset"),  # the run's own, shared by every stage task
)
class Evaluate(RunTask):
    """Scores the run's final model on the whole eval split, writes the report, blesses or not.

    Every setting of evaluate.config.EvaluateConfig but the run's own is a parameter here too.
    """

    def check_parameters(self) -> None:
        # The stage's own checks (fractions in [0, 1], a batch of at least 1, the export base
        # and model name) on the command line this task would run.
        parse_args(self.command()[3:])

    def requires(self) -> luigi.Task:
        return Train(**self.shared_params())

    def output(self) -> GFileTarget:
        return GFileTarget(
            layout.join(layout.evaluate_dir(self.output_root, self.date_str), layout.METRICS_FILE)
        )

    def command(self) -> list[str]:
        """The stage's command line; with `[Executor] kind = docker` it runs in a container."""
        args = [sys.executable, "-m", "evaluate", "--output-root", self.output_root]
        args += ["--date", self.date_str, "--dataset", self.dataset]
        return args + stage_flags(self)

    def run(self) -> None:
        self.hold_run_lock()
        logs = layout.logs_dir(self.output_root, self.date_str)
        runner.run_stage(
            self,
            "evaluate",
            self.command(),
            layout.join(logs, STAGE_LOG_FILE),
            container=config.container_settings(),
        )
        evaluate_dir = layout.evaluate_dir(self.output_root, self.date_str)
        print(f"[evaluate] {terminal.evaluation_line(evaluate_dir)}", file=sys.stderr, flush=True)
