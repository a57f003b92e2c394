"""Luigi task of the evaluate stage: maps its parameters onto `python -m evaluate`."""

from __future__ import annotations

import sys

import luigi

from contract import layout
from evaluate.__main__ import parse_args
from pipeline import config, runner, terminal
from pipeline.params import RunTask
from pipeline.targets import GFileTarget
from pipeline.train_task import Train

STAGE_LOG_FILE = "evaluate.log"


class Evaluate(RunTask):
    """Scores the run's final model on the whole eval split, writes the report, blesses or not."""

    batch_size = luigi.IntParameter(
        default=1000,
        description="Examples per inference batch; changes speed and memory, never the metrics.",
    )
    min_accuracy = luigi.OptionalFloatParameter(
        default=None,
        description="Accuracy (0-1) a model needs to be blessed; empty for no absolute threshold.",
    )
    max_regression = luigi.OptionalFloatParameter(
        default=None,
        description="Largest accuracy drop (0-1; 0.01 = one point) allowed against the last "
        "blessed model (<output_root>/latest.json) scored on this run's eval set; empty for no "
        "absolute change threshold.",
    )
    max_relative_regression = luigi.OptionalFloatParameter(
        default=None,
        description="Largest accuracy drop against that baseline as a fraction of its accuracy "
        "(0-1; 0.01 = 1 % of it); empty for no relative change threshold.",
    )
    export_base = luigi.OptionalParameter(
        default=None,
        description="Where blessed models are pushed as TF Serving SavedModels, "
        "<export_base>/<model_name>/<YYYYMMDD>/ (local path or gs:// URL); empty for "
        "<output_root>/serving.",
    )
    model_name = luigi.Parameter(
        default="nightly",
        description="The served model's name: the folder under export_base that TF Serving's "
        "--model_base_path names.",
    )

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
        args = [
            sys.executable,
            "-m",
            "evaluate",
            "--output-root",
            self.output_root,
            "--date",
            self.date_str,
            "--dataset",
            self.dataset,
            "--batch-size",
            str(self.batch_size),
        ]
        if self.min_accuracy is not None:
            args += ["--min-accuracy", repr(self.min_accuracy)]
        if self.max_regression is not None:
            args += ["--max-regression", repr(self.max_regression)]
        if self.max_relative_regression is not None:
            args += ["--max-relative-regression", repr(self.max_relative_regression)]
        if self.export_base:
            args += ["--export-base", self.export_base]
        args += ["--model-name", self.model_name]
        return args

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
