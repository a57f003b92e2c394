"""Luigi task of the preprocess stage: maps its parameters onto `python -m preprocess run`."""

from __future__ import annotations

import shlex
import sys

import luigi

from contract import layout
from pipeline import config, runner
from pipeline.params import RunTask
from pipeline.targets import GFileTarget

STAGE_LOG_FILE = "preprocess.log"


def preprocess_args(
    output_root: str,
    date: str,
    dataset: str,
    num_workers: int,
    validation_fraction: float,
    data_dir: str,
    manual_dir: str | None = None,
    manual_checksums: str | None = None,
    seed: str = "0",
    max_records_per_file: int = 100_000,
    beam_args: str = "",
) -> list[str]:
    """The arguments after `python -m preprocess` (a container executor prepends its own)."""
    args = [
        "run",
        f"--output_root={output_root}",
        f"--date={date}",
        f"--dataset={dataset}",
        f"--num_workers={num_workers}",
        f"--validation_fraction={validation_fraction!r}",
        f"--data_dir={data_dir}",
        f"--seed={seed}",
        f"--max_records_per_file={max_records_per_file}",
    ]
    if manual_dir:
        args.append(f"--manual_dir={manual_dir}")
    if manual_checksums:
        args.append(f"--manual_checksums={manual_checksums}")
    return args + shlex.split(beam_args)


class Preprocess(RunTask):
    """Builds the dataset offline if needed and writes the run's shard set and manifest."""

    validation_fraction = luigi.FloatParameter(
        default=0.1,
        description="Share of the train split held out for validation, in [0, 1).",
    )
    data_dir = luigi.Parameter(
        default=".cache/tensorflow_datasets",
        description="TFDS data folder; the dataset is built there once and reused.",
    )
    manual_dir = luigi.OptionalParameter(
        default=None,
        description="Folder with the dataset's source files, checked against "
        "preprocess/sources/<dataset>.sha256; empty to let TFDS download them.",
    )
    manual_checksums = luigi.OptionalParameter(
        default=None,
        description="sha256sum-format file of the source files; empty for the recorded one.",
    )
    seed = luigi.Parameter(
        default="0",
        description="Mixed into the keys that order and assign records; same seed, same shards.",
    )
    max_records_per_file = luigi.IntParameter(
        default=100_000,
        description="Most records in one shard file; a worker's part is split into more files.",
    )
    beam_args = luigi.Parameter(
        default="--runner=DirectRunner",
        description="Beam pipeline flags, e.g. '--runner=DataflowRunner --project=p "
        "--region=r --temp_location=gs://b/tmp'.",
    )

    def output(self) -> GFileTarget:
        return GFileTarget(
            layout.join(layout.data_dir(self.output_root, self.date_str), layout.MANIFEST_FILE)
        )

    def command(self) -> list[str]:
        """The stage's command line; with `[Executor] kind = docker` it runs in a container."""
        return [
            sys.executable,
            "-m",
            "preprocess",
            *preprocess_args(
                output_root=self.output_root,
                date=self.date_str,
                dataset=self.dataset,
                num_workers=self.num_workers,
                validation_fraction=self.validation_fraction,
                data_dir=self.data_dir,
                manual_dir=self.manual_dir,
                manual_checksums=self.manual_checksums,
                seed=self.seed,
                max_records_per_file=self.max_records_per_file,
                beam_args=self.beam_args,
            ),
        ]

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
