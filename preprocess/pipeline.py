"""The preprocess job: a TFDS dataset in, balanced per-worker shard files and a manifest out."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import logging
import os
import pathlib
import posixpath
import subprocess
import uuid
from importlib import metadata
from typing import Any

import apache_beam as beam
import tensorflow as tf
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from contract import atomic, layout, manifest
from preprocess import plan, sources, transforms
from preprocess.errors import PreprocessError

PROJECT_ROOT = pathlib.Path(__file__).resolve().parents[1]
FILES_LIST = "_files.json"
DIRECT_RUNNERS = ("DirectRunner", "SwitchingDirectRunner", "FnApiRunner", "BundleBasedDirectRunner")


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
    eval_split: str = "test"
    seed: str = "0"
    max_records_per_file: int = 100_000
    read_chunk_size: int = 10_000
    batch_size: int = 1_000
    overwrite: bool = False

    def check(self) -> None:
        """Rejects parameter values the job cannot honour.

        Raises:
            PreprocessError: naming the parameter and its allowed range.
        """
        try:
            datetime.date.fromisoformat(self.date)
        except ValueError:
            raise PreprocessError(f"date must be YYYY-MM-DD, got '{self.date}'") from None
        if self.num_workers < 1:
            raise PreprocessError(f"num_workers must be at least 1, got {self.num_workers}")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise PreprocessError(
                f"validation_fraction must be in [0, 1), got {self.validation_fraction}"
            )
        for name in ("max_records_per_file", "read_chunk_size", "batch_size"):
            if getattr(self, name) < 1:
                raise PreprocessError(f"{name} must be at least 1, got {getattr(self, name)}")


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
    parser.add_argument("--dataset", default=d.dataset, help="TFDS image-classification dataset")
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
    parser.add_argument("--train_split", default=d.train_split, help="TFDS split to train on")
    parser.add_argument("--eval_split", default=d.eval_split, help="TFDS split to evaluate on")
    parser.add_argument("--seed", default=d.seed, help="mixed into the keys that order records")
    parser.add_argument(
        "--max_records_per_file",
        type=int,
        default=d.max_records_per_file,
        help="most records in one shard file",
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


def config_from_args(args: argparse.Namespace) -> PreprocessConfig:
    """The config of parsed flags."""
    names = {f.name for f in dataclasses.fields(PreprocessConfig)}
    return PreprocessConfig(**{k: v for k, v in vars(args).items() if k in names})


def beam_options(beam_args: list[str]) -> PipelineOptions:
    """Beam's options, with the project code shipped to workers of non-direct runners."""
    options = PipelineOptions(beam_args)
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    if (
        is_direct(runner)
        and options.view_as(DirectOptions).direct_running_mode == "multi_threading"
    ):
        # Seen with apache-beam 2.77: batches reaching a ParDo with a side input go missing
        # under the FnApiRunner's threads (the manifest count check catches it, too late).
        raise PreprocessError(
            "--direct_running_mode=multi_threading loses elements in Beam's FnApiRunner: "
            "use multi_processing (with --direct_num_workers) or in_memory"
        )
    if not is_direct(runner) and "--setup_file" not in " ".join(beam_args):
        setup_file = PROJECT_ROOT / "setup.py"
        if setup_file.exists():
            options = PipelineOptions([*beam_args, f"--setup_file={setup_file}"])
    return options


def is_direct(runner: Any) -> bool:
    """Whether a runner name (or instance) runs in this machine's processes."""
    name = runner if isinstance(runner, str) else type(runner).__name__
    return name.rsplit(".", 1)[-1] in DIRECT_RUNNERS


def _make_pipeline(options: PipelineOptions) -> beam.Pipeline:
    runner = options.view_as(StandardOptions).runner
    if runner is None or runner in ("DirectRunner", "SwitchingDirectRunner"):
        # The DirectRunner would first try Prism, which downloads a binary (fails offline);
        # its batch path is the FnApiRunner, so use that directly.
        from apache_beam.runners.portability.fn_api_runner import fn_runner

        return beam.Pipeline(runner=fn_runner.FnApiRunner(), options=options)
    return beam.Pipeline(options=options)


def code_version() -> str:
    """`git describe` of the project when it is a checkout, else the installed version."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--tags"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        try:
            return metadata.version("nightly-trainer")
        except metadata.PackageNotFoundError:
            return "unknown"


def _build_pipeline(
    p: beam.Pipeline, cfg: PreprocessConfig, spec: sources.DatasetSpec, staging: str
) -> None:
    train_plan = functools.partial(
        plan.TrainPlan,
        num_workers=cfg.num_workers,
        validation_fraction=cfg.validation_fraction,
        max_records_per_file=cfg.max_records_per_file,
    )
    eval_plan = functools.partial(
        plan.WholeSplitPlan, split=layout.EVAL_SPLIT, max_records_per_file=cfg.max_records_per_file
    )
    reader = transforms.ReadTfdsChunk(
        spec.dataset_dir, spec.image_key, spec.label_key, cfg.batch_size
    )
    entries = []
    for label, split, make_plan in (
        ("Train", cfg.train_split, train_plan),
        ("Eval", cfg.eval_split, eval_plan),
    ):
        chunks = transforms.read_chunks(split, spec.split_sizes[split], cfg.read_chunk_size)
        entries.append(
            p
            | f"{label}Chunks" >> beam.Create(chunks, reshuffle=False)
            | f"Distribute{label}Chunks" >> beam.Reshuffle()
            | f"Read{label}" >> beam.ParDo(reader)
            | f"Shard{label}" >> transforms.ShardSplit(make_plan, cfg.seed, staging)
        )
    _ = (
        entries
        | "MergeEntries" >> beam.Flatten()
        | "ListEntries" >> beam.combiners.ToList()
        | "WriteFileList"
        >> beam.Map(lambda e: atomic.write_json_atomic(layout.join(staging, FILES_LIST), e))
    )


def build_manifest(
    cfg: PreprocessConfig, spec: sources.DatasetSpec, files: list[dict[str, Any]]
) -> dict[str, Any]:
    """The manifest document (schema in contract.manifest) of a written shard set.

    Raises:
        PreprocessError: the written counts disagree with the dataset's split sizes.
    """
    train = plan.TrainPlan(
        spec.split_sizes[cfg.train_split],
        cfg.num_workers,
        cfg.validation_fraction,
        cfg.max_records_per_file,
    )
    counts = {s: sum(f["num_examples"] for f in files if f["split"] == s) for s in layout.SPLITS}
    expected = {
        layout.TRAIN_SPLIT: train.num_train,
        layout.VALIDATION_SPLIT: train.num_validation + train.leftover_examples,
        layout.EVAL_SPLIT: spec.split_sizes[cfg.eval_split],
    }
    if counts != expected:
        raise PreprocessError(f"written example counts {counts} differ from expected {expected}")
    return {
        "schema_version": manifest.SCHEMA_VERSION,
        "dataset": {
            "name": spec.name,
            "version": spec.version,
            "train_split": cfg.train_split,
            "eval_split": cfg.eval_split,
        },
        "parameters": dataclasses.asdict(cfg),
        "num_workers": cfg.num_workers,
        "image_shape": spec.image_shape,
        "num_classes": len(spec.class_names),
        "class_names": spec.class_names,
        "feature_spec": {"image": "bytes: raw uint8 HxWxC", "label": "int64 class index"},
        "splits": {
            layout.TRAIN_SPLIT: {
                "num_examples": train.num_train,
                "examples_per_worker": train.examples_per_worker,
                "leftover_examples": train.leftover_examples,
            },
            layout.VALIDATION_SPLIT: {
                "num_examples": counts[layout.VALIDATION_SPLIT],
                "held_out_examples": train.num_validation,
                "leftover_train_examples": train.leftover_examples,
            },
            layout.EVAL_SPLIT: {"num_examples": counts[layout.EVAL_SPLIT]},
        },
        "files": sorted(files, key=lambda f: f["path"]),
        "code_version": code_version(),
        "created_utc": datetime.datetime.now(datetime.UTC).isoformat(),
    }


def _is_local(path: str) -> bool:
    return "://" not in path


def _remove(path: str) -> None:
    if tf.io.gfile.exists(path):
        tf.io.gfile.rmtree(path)


def publish(staging: str, final: str, doc: dict[str, Any]) -> None:
    """Moves the staged files to `final` so that the manifest appears last.

    Locally the whole folder is renamed at once; on object stores (no folder rename) each file
    is moved and the manifest is written after all of them.
    """
    old = f"{final}.old-{uuid.uuid4().hex[:8]}"
    if tf.io.gfile.exists(final):
        tf.io.gfile.rename(final, old)
    if _is_local(final):
        atomic.write_json_atomic(layout.join(staging, layout.MANIFEST_FILE), doc)
        os.rename(staging, final)
    else:
        for entry in doc["files"]:
            target = layout.join(final, entry["path"])
            tf.io.gfile.makedirs(posixpath.dirname(target))
            tf.io.gfile.rename(layout.join(staging, entry["path"]), target, overwrite=True)
        atomic.write_json_atomic(layout.join(final, layout.MANIFEST_FILE), doc)
        _remove(staging)
    _remove(old)


def _check_splits(cfg: PreprocessConfig, spec: sources.DatasetSpec) -> None:
    for split in (cfg.train_split, cfg.eval_split):
        if split not in spec.split_sizes:
            raise PreprocessError(
                f"TFDS dataset '{spec.name}' has no split '{split}'; "
                f"it has {sorted(spec.split_sizes)}"
            )
    n = spec.split_sizes[cfg.train_split]
    left = n - plan.num_validation_examples(n, cfg.validation_fraction)
    if cfg.num_workers > left:
        raise PreprocessError(
            f"num_workers {cfg.num_workers} is larger than the {left} training examples of "
            f"'{spec.name}' left after validation: lower --num_workers"
        )


def _make_staging(data_dir: str) -> str:
    staging = f"{data_dir}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        tf.io.gfile.makedirs(staging)
        atomic.write_bytes_atomic(layout.join(staging, ".writable"), b"")
        tf.io.gfile.remove(layout.join(staging, ".writable"))
    except (OSError, tf.errors.OpError) as e:
        reason = getattr(e, "message", None) or e.strerror or str(e)
        raise PreprocessError(
            f"cannot write to output folder {posixpath.dirname(data_dir)}: {reason}"
        ) from None
    return staging


def run_preprocess(cfg: PreprocessConfig, beam_args: list[str] | None = None) -> dict[str, Any]:
    """Runs the whole stage: prepare the dataset, shard it with Beam, publish with a manifest.

    Args:
        cfg: the stage's parameters.
        beam_args: Beam pipeline flags (runner and its options).

    Returns:
        The manifest written to `<output_root>/<date>/data/manifest.json`.

    Raises:
        PreprocessError: bad parameters, dataset or output folder; nothing is left that looks
            complete.
    """
    cfg.check()
    options = beam_options(beam_args or [])
    data_dir = layout.data_dir(cfg.output_root, cfg.date)
    manifest_path = layout.join(data_dir, layout.MANIFEST_FILE)
    if tf.io.gfile.exists(manifest_path) and not cfg.overwrite:
        raise PreprocessError(
            f"shard set already complete: {manifest_path} exists (pass --overwrite to replace it)"
        )
    staging = _make_staging(data_dir)
    try:
        builder = sources.prepare_dataset(
            cfg.dataset, cfg.data_dir, cfg.manual_dir, cfg.manual_checksums
        )
        spec = sources.describe(builder)
        _check_splits(cfg, spec)
        with _make_pipeline(options) as p:
            _build_pipeline(p, cfg, spec, staging)
        files_path = layout.join(staging, FILES_LIST)
        files = atomic.read_json(files_path)
        tf.io.gfile.remove(files_path)
        doc = build_manifest(cfg, spec, files)
        publish(staging, data_dir, doc)
    finally:
        _remove(staging)
    logging.info("wrote %d files and %s", len(doc["files"]), manifest_path)
    return doc


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Parses the stage's flags, passes the rest to Beam and runs the stage."""
    parser = argparse.ArgumentParser(
        prog="python -m preprocess run", description=__doc__, allow_abbrev=False
    )
    add_arguments(parser)
    args, beam_args = parser.parse_known_args(argv)
    return run_preprocess(config_from_args(args), beam_args)
