"""Luigi task of the preprocess stage: maps its parameters onto `python -m preprocess run`."""

from __future__ import annotations

import dataclasses
import shlex
import sys

import luigi

from contract import layout
from pipeline import config, runner
from pipeline.params import RunTask
from pipeline.stage_params import stage_flags, stage_parameters
from pipeline.targets import GFileTarget
from preprocess.config import PreprocessConfig
from preprocess.errors import BadInputError

STAGE_LOG_FILE = "preprocess.log"


@stage_parameters(
    PreprocessConfig,
    # The run's own values (every stage task's), and replacing a complete shard set, which
    # FullRun's --force-stage does by moving the old one aside.
    skip=("output_root", "date", "dataset", "num_workers", "overwrite"),
)
class Preprocess(RunTask):
    """Builds the dataset offline if needed and writes the run's shard set and manifest.

    Every setting of preprocess.config.PreprocessConfig but the run's own is a parameter here
    too (same name, type, description and default).
    """

    beam_args = luigi.Parameter(
        default="--runner=DirectRunner",
        description="Beam pipeline flags, e.g. '--runner=DataflowRunner --project=p "
        "--region=r --temp_location=gs://b/tmp'.",
    )

    def check_parameters(self) -> None:
        # The stage's own range checks (fractions, worker count, sizes) on this task's values.
        fields = {f.name for f in dataclasses.fields(PreprocessConfig)}
        values = {k: v for k, v in self.param_kwargs.items() if k in fields}
        try:
            PreprocessConfig(**{**values, "date": self.date_str}).check()
        except BadInputError as e:
            raise ValueError(str(e)) from None

    def output(self) -> GFileTarget:
        return GFileTarget(
            layout.join(layout.data_dir(self.output_root, self.date_str), layout.MANIFEST_FILE)
        )

    def command(self) -> list[str]:
        """The stage's command line; with `[Executor] kind = docker` it runs in a container."""
        args = [sys.executable, "-m", "preprocess", "run", f"--output_root={self.output_root}"]
        args += [f"--date={self.date_str}", f"--dataset={self.dataset}"]
        args += [f"--num_workers={self.num_workers}", *stage_flags(self)]
        return args + shlex.split(self.beam_args)

    def run(self) -> None:
        self.hold_run_lock()
        logs = layout.logs_dir(self.output_root, self.date_str)
        runner.run_stage(
            self,
            "preprocess",
            self.command(),
            layout.join(logs, STAGE_LOG_FILE),
            container=config.container_settings(),
        )
