"""The preprocess stage's own parameters and their command-line flags."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import difflib

from contract import dates
from preprocess.errors import BadInputError

# The eval split that falls back to a held-out part of the train split when the dataset has
# no split of that name (any other eval split must exist).
DEFAULT_EVAL_SPLIT = "test"


@dataclasses.dataclass(frozen=True)
class PreprocessConfig:
    """The stage's own parameters (Beam's options travel separately)."""

    output_root: str
    date: str
    dataset: str = "fashion_mnist"
    num_workers: int = 2
    validation_fraction: float = 0.1
    data_dir: str = ".cache/tensorflow_datasets"
    manual_dir: str | None = None
    manual_checksums: str | None = None
    train_split: str = "train"
    eval_split: str = DEFAULT_EVAL_SPLIT
    eval_fraction: float = 0.1
    window_days: int | None = None
    resize: str = ""
    image_feature: str = "image"
    label_feature: str = "label"
    raw_image_shape: str = ""
    seed: str = "0"
    max_records_per_file: int = 100_000
    max_bytes_per_file: int = 128 << 20
    bucket_bytes: int = 64 << 20
    read_chunk_size: int = 10_000
    batch_size: int = 1_000
    overwrite: bool = False

    def check(self) -> None:
        """Rejects parameter values the job cannot honour.

        Raises:
            BadInputError: naming the parameter and its allowed range.
        """
        try:
            dates.parse(self.date)
        except dates.DateError as e:
            raise BadInputError(str(e)) from None
        if self.num_workers < 1:
            raise BadInputError(f"num_workers must be at least 1, got {self.num_workers}")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise BadInputError(
                f"validation_fraction must be in [0, 1), got {self.validation_fraction}"
            )
        if not 0.0 < self.eval_fraction < 1.0:
            raise BadInputError(f"eval_fraction must be in (0, 1), got {self.eval_fraction}")
        self.resize_shape()
        self.raw_shape()
        for name in (
            "max_records_per_file",
            "max_bytes_per_file",
            "bucket_bytes",
            "read_chunk_size",
            "batch_size",
        ):
            if getattr(self, name) < 1:
                raise BadInputError(f"{name} must be at least 1, got {getattr(self, name)}")

    def resize_shape(self) -> tuple[int, int] | None:
        """`resize` as (height, width), or None when images keep their size.

        Raises:
            BadInputError: `resize` is not HxW with positive whole numbers.
        """
        size = parse_dimensions("resize", self.resize, ("H", "W"))
        return (size[0], size[1]) if size else None

    def raw_shape(self) -> list[int] | None:
        """`raw_image_shape` as [H, W, C], or None when images are encoded (PNG, JPEG, ...).

        Raises:
            BadInputError: `raw_image_shape` is not HxWxC with positive whole numbers.
        """
        return parse_dimensions("raw_image_shape", self.raw_image_shape, ("H", "W", "C"))


def parse_dimensions(name: str, text: str, parts: tuple[str, ...]) -> list[int] | None:
    """'28x28' (or '28x28x1') as [28, 28] ([28, 28, 1]); None for an empty value.

    Raises:
        BadInputError: naming the parameter and the form it takes.
    """
    if not text:
        return None
    pieces = text.lower().split("x")
    if len(pieces) != len(parts) or not all(p.isdigit() and int(p) > 0 for p in pieces):
        raise BadInputError(
            f"{name} must be {'x'.join(parts)} in positive whole numbers "
            f"(e.g. {'x'.join(['32', '32', '3'][: len(parts)])}), got '{text}'"
        )
    return [int(p) for p in pieces]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declares the stage's own flags (everything else on the command line goes to Beam)."""
    d = PreprocessConfig(output_root="", date="")
    parser.add_argument(
        "--output_root",
        "--output-root",
        required=True,
        help="folder (local or gs://) holding one subfolder per run date",
    )
    parser.add_argument(
        "--date",
        default=datetime.date.today().isoformat(),
        help="run date YYYY-MM-DD; output goes to <output_root>/<date>/data",
    )
    parser.add_argument(
        "--dataset",
        default=d.dataset,
        help="a TFDS name ('fashion_mnist', 'name/config'), a TFDS builder by import path "
        "('tfds:my_pkg.my_module[:MyBuilder]'), an image folder ('imagefolder:ROOT') or "
        "TFRecord files of tf.train.Example ('tfrecord:[SPLIT=]PATTERN[,...]'); "
        "see docs/extending.md",
    )
    parser.add_argument(
        "--num_workers",
        "--num-workers",
        type=int,
        default=d.num_workers,
        help="number of training workers the train split is cut for",
    )
    parser.add_argument(
        "--validation_fraction",
        "--validation-fraction",
        type=float,
        default=d.validation_fraction,
        help="share of the train split held out for validation, in [0, 1)",
    )
    parser.add_argument("--data_dir", "--data-dir", default=d.data_dir, help="TFDS data folder")
    parser.add_argument(
        "--manual_dir",
        "--manual-dir",
        default=None,
        help="folder with the dataset's source files (offline build); omit to let TFDS download",
    )
    parser.add_argument(
        "--manual_checksums",
        "--manual-checksums",
        default=None,
        help="sha256sum file of the source files (default preprocess/sources/<dataset>.sha256)",
    )
    parser.add_argument(
        "--train_split",
        default=d.train_split,
        help="split to train on, in TFDS split syntax ('train', 'train[:90%%]', 'train+extra')",
    )
    parser.add_argument(
        "--eval_split",
        default=d.eval_split,
        help=f"split to evaluate on, in TFDS split syntax; '{DEFAULT_EVAL_SPLIT}' on a dataset "
        "without one holds out --eval_fraction of the train split instead",
    )
    parser.add_argument(
        "--eval_fraction",
        type=float,
        default=d.eval_fraction,
        help=f"share of the train split held out for evaluation when the dataset has no "
        f"'{DEFAULT_EVAL_SPLIT}' split, in (0, 1)",
    )
    parser.add_argument(
        "--window_days",
        "--window-days",
        type=int,
        default=d.window_days,
        help="drops: datasets: read the last N days of drops up to and including --date "
        "(default 1: the run's own day)",
    )
    parser.add_argument(
        "--resize",
        default=d.resize,
        help="HxW every image is resized to (imagefolder, tfrecord); empty: all images must "
        "have one size",
    )
    parser.add_argument(
        "--image_feature",
        default=d.image_feature,
        help="tfrecord: the tf.train.Example feature holding the image",
    )
    parser.add_argument(
        "--label_feature",
        default=d.label_feature,
        help="tfrecord: the feature holding the label (int64 class index or bytes class name)",
    )
    parser.add_argument(
        "--raw_image_shape",
        default=d.raw_image_shape,
        help="tfrecord: HxWxC when the image feature holds raw uint8 pixels; empty: encoded "
        "(PNG, JPEG, GIF, BMP)",
    )
    parser.add_argument("--seed", default=d.seed, help="mixed into the keys that order records")
    parser.add_argument(
        "--max_records_per_file",
        type=int,
        default=d.max_records_per_file,
        help="most records in one shard file",
    )
    parser.add_argument(
        "--max_bytes_per_file",
        type=int,
        default=d.max_bytes_per_file,
        help="most bytes in one shard file (files are cut by bytes, then by record count)",
    )
    parser.add_argument(
        "--bucket_bytes",
        type=int,
        default=d.bucket_bytes,
        help="about how many bytes of records one Beam worker sorts at a time",
    )
    parser.add_argument(
        "--read_chunk_size",
        type=int,
        default=d.read_chunk_size,
        help="examples per read task (the unit of read parallelism)",
    )
    parser.add_argument(
        "--batch_size", type=int, default=d.batch_size, help="records per Beam element"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a complete shard set of the same date"
    )


def check_beam_flags(beam_args: list[str], parser: argparse.ArgumentParser) -> None:
    """Refuses what is left on the command line after the stage's own flags when Beam does not
    know it either: PipelineOptions would drop it with a log line, so a misspelled flag
    (`--num_worker 4`) ran with the default instead.

    Every runner's flags count (those of the options classes Beam has loaded, and the Dask
    runner's), so `--runner`, `--direct_num_workers` or `--dask_client_address` pass.

    Raises:
        BadInputError: naming the unknown flags, with the nearest known flag when there is one.
    """
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    with contextlib.suppress(ImportError):  # registers DaskOptions, where Dask is installed
        from apache_beam.runners.dask import dask_runner  # noqa: F401
    beam = _BeamArgumentParser(allow_abbrev=False, add_help=False)
    # What PipelineOptions.get_all_options parses with: every options class's flags.
    classes = {str(cls): cls for cls in PipelineOptions.__subclasses__()}
    for cls in classes.values():
        cls._add_argparse_args(beam)
    _, unknown = beam.parse_known_args(beam_args)
    if not unknown:
        return
    known = [o for p in (parser, beam) for a in p._actions for o in a.option_strings]
    named = []
    for arg in unknown:
        name = arg.split("=", 1)[0]
        close = difflib.get_close_matches(name, known, n=1) if name.startswith("-") else []
        named.append(f"{arg} (did you mean {close[0]}?)" if close else arg)
    raise BadInputError(
        f"unknown argument(s) {', '.join(named)}: neither the preprocess stage nor Beam "
        "knows them; see python -m preprocess run --help"
    )


def config_from_args(args: argparse.Namespace) -> PreprocessConfig:
    """The config of parsed flags."""
    names = {f.name for f in dataclasses.fields(PreprocessConfig)}
    return PreprocessConfig(**{k: v for k, v in vars(args).items() if k in names})
