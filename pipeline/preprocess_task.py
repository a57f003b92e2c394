"""Luigi task of the preprocess stage: maps its parameters onto `python -m preprocess run`."""

from __future__ import annotations

import dataclasses
import shlex
import sys

import luigi

from contract import layout
from pipeline import config, runner
from pipeline.params import RunTask
from pipeline.targets import GFileTarget
from preprocess.config import PreprocessConfig
from preprocess.errors import BadInputError

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
    train_split: str = "train",
    eval_split: str = "test",
    eval_fraction: float = 0.1,
    resize: str = "",
    image_feature: str = "image",
    label_feature: str = "label",
    raw_image_shape: str = "",
    window_days: int | None = None,
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
        f"--train_split={train_split}",
        f"--eval_split={eval_split}",
        f"--eval_fraction={eval_fraction!r}",
        f"--resize={resize}",
        f"--image_feature={image_feature}",
        f"--label_feature={label_feature}",
        f"--raw_image_shape={raw_image_shape}",
    ]
    if window_days is not None:
        args.append(f"--window_days={window_days}")
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
    train_split = luigi.Parameter(
        default="train",
        description="Split to train on, in TFDS split syntax ('train', 'train[:90%]', "
        "'train+extra'); validation is held out of it.",
    )
    eval_split = luigi.Parameter(
        default="test",
        description="Split to evaluate on, in TFDS split syntax. 'test' on a dataset without "
        "a test split holds out eval_fraction of the train split instead (recorded in the "
        "manifest); any other name must exist.",
    )
    eval_fraction = luigi.FloatParameter(
        default=0.1,
        description="Share of the train split held out for evaluation when the dataset has "
        "no test split, in (0, 1); cut by the seed's hash, like validation.",
    )
    window_days = luigi.OptionalIntParameter(
        default=None,
        description="drops: datasets: train on the last N days of drops up to and including "
        "the run's date (earlier days without files are listed in the manifest; the run's own "
        "day without files fails the run). Empty: the run's own day only.",
    )
    resize = luigi.Parameter(
        default="",
        description="HxW every image is resized to (imagefolder: and tfrecord: datasets); "
        "empty: all images must have one size.",
    )
    image_feature = luigi.Parameter(
        default="image",
        description="tfrecord: datasets: the tf.train.Example feature holding the image.",
    )
    label_feature = luigi.Parameter(
        default="label",
        description="tfrecord: datasets: the feature holding the label (int64 class index "
        "or bytes class name).",
    )
    raw_image_shape = luigi.Parameter(
        default="",
        description="tfrecord: datasets: HxWxC when the image feature holds raw uint8 "
        "pixels; empty when it holds encoded images (PNG, JPEG, GIF, BMP).",
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
                train_split=self.train_split,
                eval_split=self.eval_split,
                eval_fraction=self.eval_fraction,
                resize=self.resize,
                image_feature=self.image_feature,
                label_feature=self.label_feature,
                raw_image_shape=self.raw_image_shape,
                window_days=self.window_days,
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
