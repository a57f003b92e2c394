"""Luigi task of the preprocess stage: `python -m preprocess run` for the night's run."""

from __future__ import annotations

import shlex

import luigi

from pipeline.stage_task import StageSpec, StageTask, stage_task
from preprocess.config import PreprocessConfig

SPEC = StageSpec(
    name="preprocess",
    module=("preprocess", "run"),
    config_class=PreprocessConfig,
    output=lambda run: run.manifest_path,
    log_file="preprocess.log",
    run_settings=("output_root", "date", "dataset", "num_workers"),
    # Replacing a complete shard set is FullRun's --force-stage, which moves the old one aside.
    skip=("overwrite",),
)


@stage_task(SPEC)
class Preprocess(StageTask):
    """Builds the dataset offline if needed and writes the run's shard set and manifest.

    Every setting of preprocess.config.PreprocessConfig but the run's own is a parameter here
    too (same name, type, description and default).
    """

    beam_args = luigi.Parameter(
        default="--runner=DirectRunner",
        description="Beam pipeline flags, e.g. '--runner=DataflowRunner --project=p "
        "--region=r --temp_location=gs://b/tmp'.",
    )

    def extra_args(self) -> list[str]:
        # The stage passes the flags it does not know to Beam's PipelineOptions.
        return shlex.split(self.beam_args)
