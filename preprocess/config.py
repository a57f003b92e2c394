"""The preprocess stage's own parameters and their command-line flags."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import difflib

from contract import dates, messages, settings, storage
from contract.run import DEFAULT_DATASET
from preprocess.errors import BadInputError

DESCRIPTION = (
    "The preprocess job: a dataset in, balanced per-worker shard files and a manifest out."
)

# The eval split that falls back to a held-out part of the train split when the dataset has
# no split of that name (any other eval split must exist).
DEFAULT_EVAL_SPLIT = "test"


@dataclasses.dataclass(frozen=True)
class PreprocessConfig:
    """The stage's own parameters (Beam's options travel separately)."""

    output_root: str = dataclasses.field(
        metadata={"help": "Folder (local path or gs:// URL) holding one subfolder per run date."}
    )
    date: str = dataclasses.field(
        metadata={"help": "The run's date, YYYY-MM-DD; output goes to <output_root>/<date>/data."}
    )
    dataset: str = dataclasses.field(
        default=DEFAULT_DATASET,
        metadata={
            "help": "The images to train on: a TFDS name ('fashion_mnist', 'name/config'), a "
            "TFDS builder by import path ('tfds:my_pkg.my_module[:MyBuilder]'), an image "
            "folder ('imagefolder:ROOT', ROOT/<class name>/*.png|jpg) or TFRecord files of "
            "tf.train.Example ('tfrecord:[SPLIT=]PATTERN[,...]'); see docs/extending.md."
        },
    )
    num_workers: int = dataclasses.field(
        default=2,
        metadata={"help": "Number of training workers; the shard set is cut into this many parts."},
    )
    validation_fraction: float = dataclasses.field(
        default=0.1,
        metadata={"help": "Share of the train split held out for validation, in [0, 1)."},
    )
    data_dir: str = dataclasses.field(
        default=".cache/tensorflow_datasets",
        metadata={"help": "TFDS data folder; the dataset is built there once and reused."},
    )
    manual_dir: str | None = dataclasses.field(
        default=None,
        metadata={
            "help": "Folder with the dataset's source files for an offline build, checked "
            "against preprocess/sources/<dataset>.sha256 or manual_checksums; empty to let "
            "TFDS download them."
        },
    )
    manual_checksums: str | None = dataclasses.field(
        default=None,
        metadata={"help": "sha256sum-format file of the source files; empty for the recorded one."},
    )
    train_split: str = dataclasses.field(
        default="train",
        metadata={
            "help": "Split to train on, in TFDS split syntax ('train', 'train[:90%]', "
            "'train+extra'); validation is held out of it."
        },
    )
    eval_split: str = dataclasses.field(
        default=DEFAULT_EVAL_SPLIT,
        metadata={
            "help": f"Split to evaluate on, in TFDS split syntax. '{DEFAULT_EVAL_SPLIT}' on a "
            "dataset without such a split holds out eval_fraction of the train split instead "
            "(recorded in the manifest); any other name must exist."
        },
    )
    eval_fraction: float = dataclasses.field(
        default=0.1,
        metadata={
            "help": "Share of the train split held out for evaluation when the dataset has no "
            f"'{DEFAULT_EVAL_SPLIT}' split, in (0, 1); cut by the seed's hash, like validation "
            "(daily drops: by each image's sha256, so an image never moves from one night's "
            "training data to a later night's eval split)."
        },
    )
    max_eval_overlap: int = dataclasses.field(
        default=0,
        metadata={
            "help": "Most eval examples whose image bytes are also a train or validation "
            "example's (counted by sha256 in the Beam job, recorded in the manifest as "
            "splits.eval.duplicates_in_training); more fails the stage and publishes nothing."
        },
    )
    window_days: int | None = dataclasses.field(
        default=None,
        metadata={
            "help": "drops: datasets: train on the last N days of drops up to and including "
            "the run's date (earlier days without files are listed in the manifest; the run's "
            "own day without files fails the run). Empty: the run's own day only."
        },
    )
    resize: str = dataclasses.field(
        default="",
        metadata={
            "help": "HxW every image is resized to (imagefolder: and tfrecord: datasets); "
            "empty: all images must have one size."
        },
    )
    image_feature: str = dataclasses.field(
        default="image",
        metadata={"help": "tfrecord: datasets: the tf.train.Example feature holding the image."},
    )
    label_feature: str = dataclasses.field(
        default="label",
        metadata={
            "help": "tfrecord: datasets: the feature holding the label (int64 class index or "
            "bytes class name)."
        },
    )
    raw_image_shape: str = dataclasses.field(
        default="",
        metadata={
            "help": "tfrecord: datasets: HxWxC when the image feature holds raw uint8 pixels; "
            "empty when it holds encoded images (PNG, JPEG, GIF, BMP)."
        },
    )
    seed: int = dataclasses.field(
        default=0,
        metadata={
            "help": "Mixed into the keys that order and assign records; same seed, same shards."
        },
    )
    max_records_per_file: int = dataclasses.field(
        default=100_000,
        metadata={
            "help": "Most records in one shard file; a worker's part is split into more files."
        },
    )
    max_bytes_per_file: int = dataclasses.field(
        default=128 << 20,
        metadata={
            "help": "Most bytes in one shard file (files are cut by bytes, then by record count)."
        },
    )
    bucket_bytes: int = dataclasses.field(
        default=64 << 20,
        metadata={"help": "About how many bytes of records one Beam worker sorts at a time."},
    )
    read_chunk_size: int = dataclasses.field(
        default=10_000,
        metadata={
            "help": "Examples per read task (the unit of read parallelism); speed only, never "
            "the bytes written."
        },
    )
    batch_size: int = dataclasses.field(
        default=1_000,
        metadata={"help": "Records per Beam element; speed only, never the bytes written."},
    )
    overwrite: bool = dataclasses.field(
        default=False,
        metadata={
            "help": "Replace a complete shard set of the same date; without it the stage refuses."
        },
    )

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
        if self.seed < 0:
            raise BadInputError(f"seed must be 0 or more, got {self.seed}")
        if self.max_eval_overlap < 0:
            raise BadInputError(
                f"max_eval_overlap must be at least 0 (a number of eval examples), "
                f"got {self.max_eval_overlap}"
            )
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
    """Declares the stage's own flags (everything else on the command line goes to Beam):
    one per PreprocessConfig field, as `--num_workers` (Beam's spelling) or `--num-workers`."""
    today = datetime.date.today().isoformat()
    settings.add_flags(parser, PreprocessConfig, underscores=True, defaults={"date": today})


def check_beam_flags(beam_args: list[str], parser: argparse.ArgumentParser) -> None:
    """Refuses what is left on the command line after the stage's own flags when Beam does not
    know it either: PipelineOptions would drop it with a log line, so a misspelled flag
    (`--num_worker 4`) ran with the default instead.

    Every runner's flags count (those of the options classes Beam has loaded, and the Dask
    runner's), so `--runner`, `--direct_num_workers` or `--dask_client_address` pass.

    Raises:
        BadInputError: naming the unknown flags, with the nearest known flag when there is one.
    """
    import apache_beam  # noqa: F401  (every options class of Beam's own, registered)
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
    config: PreprocessConfig = settings.from_flags(PreprocessConfig, args)
    return config


def parse_command_line(argv: list[str] | None) -> tuple[PreprocessConfig, list[str]]:
    """`python -m preprocess run`'s flags: the stage's config, checked, and Beam's flags.

    Needs Beam's options but not the job (TensorFlow): bad input is refused within a second.

    Raises:
        BadInputError: a bad value or an unknown flag, named.
        UnsupportedStorageError: a path's scheme is neither local nor gs://.
    """
    parser = messages.StageArgumentParser(
        prog="python -m preprocess run", description=DESCRIPTION, allow_abbrev=False
    )
    add_arguments(parser)
    args, beam_args = parser.parse_known_args(argv)
    cfg = config_from_args(args)
    storage.check_supported(cfg.output_root)
    storage.check_supported(cfg.data_dir, "TFDS data dir")
    cfg.check()
    check_beam_flags(beam_args, parser)
    return cfg, beam_args
