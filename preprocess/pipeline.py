"""The preprocess job: a TFDS dataset in, balanced per-worker shard files and a manifest out."""

from __future__ import annotations

import argparse
import functools
import logging
from typing import Any

import apache_beam as beam
import tensorflow as tf
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from contract import atomic, layout
from preprocess import plan, shard_set, sources, transforms
from preprocess.config import PreprocessConfig, add_arguments, config_from_args
from preprocess.errors import PreprocessError

FILES_LIST = "_files.json"
DIRECT_RUNNERS = ("DirectRunner", "SwitchingDirectRunner", "FnApiRunner", "BundleBasedDirectRunner")


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
        setup_file = shard_set.PROJECT_ROOT / "setup.py"
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
    staging = shard_set.make_staging(data_dir)
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
        doc = shard_set.build_manifest(cfg, spec, files)
        shard_set.publish(staging, data_dir, doc)
    finally:
        shard_set.remove(staging)
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
