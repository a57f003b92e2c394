"""The preprocess job: a dataset in, balanced per-worker shard files and a manifest out."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
from typing import Any

import apache_beam as beam
import numpy as np
import tensorflow as tf
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from contract import atomic, layout, manifest, records, storage
from preprocess import (
    dask_support,
    datasets,
    drops,
    eval_overlap,
    plan,
    reading,
    shard_set,
    source_overlap,
    sources,
    statistics,
    transforms,
)
from preprocess.config import PreprocessConfig
from preprocess.errors import BadInputError, PreprocessError, from_runner_failure

FILES_LIST = "_files.json"
TRAIN_ROLE, EVAL_ROLE = "train", "eval"  # which source split a record came from
MIN_BUCKETS = 16  # so that sorting is spread over workers even for small datasets
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
    if (
        not is_direct(runner)
        and not dask_support.is_dask(options)  # Dask workers get the code from prepare()
        and "--setup_file" not in " ".join(beam_args)
    ):
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
    if dask_support.is_dask(options):
        # Beam knows the DaskRunner only by its full module path.
        from apache_beam.runners.dask.dask_runner import DaskRunner

        return beam.Pipeline(runner=DaskRunner(), options=options)
    return beam.Pipeline(options=options)


def record_bytes(spec: sources.DatasetSpec) -> int:
    """Bytes of one framed record. Images have a fixed shape, so every record has this size
    (a label below 128 takes one varint byte less than the largest label, and a daily drop's
    record of an undated file has no day)."""
    image = np.zeros(spec.image_shape, np.uint8)
    day = "YYYY-MM-DD" if spec.adapter == drops.ADAPTER else None
    return len(records.encode_example(image, max(0, len(spec.class_names) - 1), day)) + 16


def resolve_roles(
    cfg: PreprocessConfig, spec: sources.DatasetSpec
) -> dict[str, list[reading.SplitRange]]:
    """What each source role reads: the train split, and the eval split unless it is held out
    of the train split (`datasets.holds_out_eval`), as ranges of the dataset's own splits.

    Raises:
        BadInputError: a split expression is malformed or names a split the dataset lacks.
    """
    roles = {TRAIN_ROLE: datasets.resolve_split(spec, cfg.train_split)}
    if not datasets.holds_out_eval(cfg, spec):
        roles[EVAL_ROLE] = datasets.resolve_split(spec, cfg.eval_split)
    return roles


def role_sizes(roles: dict[str, list[reading.SplitRange]]) -> dict[str, int]:
    """Examples each source role reads."""
    return {role: sum(end - start for _, start, end in ranges) for role, ranges in roles.items()}


def make_plans(
    cfg: PreprocessConfig, spec: sources.DatasetSpec, held_out: bool
) -> dict[str, transforms.MakePlan]:
    """Each role's plan maker (number of examples → plan); files are cut by bytes.

    With `held_out`, the train role's plan also cuts the eval split by rank and there is no
    eval role. (An eval split held out by image digest is an eval role the job fills.)
    """
    per_file = plan.records_per_file(
        record_bytes(spec), cfg.max_bytes_per_file, cfg.max_records_per_file
    )
    plans: dict[str, transforms.MakePlan] = {
        TRAIN_ROLE: functools.partial(
            plan.TrainPlan,
            num_workers=cfg.num_workers,
            validation_fraction=cfg.validation_fraction,
            max_records_per_file=per_file,
            eval_fraction=cfg.eval_fraction if held_out else 0.0,
        )
    }
    if not held_out:
        plans[EVAL_ROLE] = functools.partial(
            plan.WholeSplitPlan, split=layout.EVAL_SPLIT, max_records_per_file=per_file
        )
    return plans


def _build_pipeline(
    p: beam.Pipeline,
    cfg: PreprocessConfig,
    source: datasets.Source,
    roles: dict[str, list[reading.SplitRange]],
    staging: str,
) -> None:
    spec = source.spec
    by_image = datasets.holds_out_eval_by_image(cfg, spec)
    plans = make_plans(cfg, spec, EVAL_ROLE not in roles and not by_image)
    expressions = {TRAIN_ROLE: cfg.train_split, EVAL_ROLE: cfg.eval_split}
    reader = reading.SplitChunkReader(
        source.reader, {expressions[role]: ranges for role, ranges in roles.items()}
    )
    chunks, plans_and_bits = {}, {}
    for role, size in sorted(role_sizes(roles).items(), reverse=True):
        label = role.title()
        chunks[role] = (
            p
            | f"{label}Chunks"
            >> beam.Create(
                reading.read_chunks(expressions[role], size, cfg.read_chunk_size), reshuffle=False
            )
            | f"Distribute{label}Chunks" >> beam.Reshuffle()
        )
        bits = transforms.bucket_bits(size, record_bytes(spec), cfg.bucket_bytes, MIN_BUCKETS)
        plans_and_bits[role] = (plans[role], bits)
    hold_out = None
    if by_image:  # the eval role is what the train role's reading holds out
        plans_and_bits[EVAL_ROLE] = (plans[EVAL_ROLE], plans_and_bits[TRAIN_ROLE][1])
        hold_out = (EVAL_ROLE, cfg.eval_fraction)
    written = chunks | "Shard" >> transforms.ShardSplits(
        plans_and_bits, str(cfg.seed), staging, reader, hold_out
    )
    counted = written | "CountFileStatistics" >> beam.Map(
        statistics.file_counts,
        staging_dir=staging,
        image_shape=spec.image_shape,
        num_classes=len(spec.class_names),
    )
    digest_bits = transforms.bucket_bits(
        sum(role_sizes(roles).values()), eval_overlap.DIGEST_BYTES, cfg.bucket_bytes, MIN_BUCKETS
    )
    duplicates = written | "CountEvalDuplicates" >> eval_overlap.CountEvalDuplicates(
        staging, digest_bits
    )
    # Both branches end in one last step: the DaskRunner computes only the graph's last step.
    _ = (
        (counted, duplicates)
        | "MergeCounts" >> beam.Flatten()
        | "ListEntries" >> beam.CombineGlobally(beam.combiners.ToListCombineFn()).without_defaults()
        | "WriteFileList"
        >> beam.Map(lambda e: atomic.write_json_atomic(layout.join(staging, FILES_LIST), e))
    )


def check_written(
    cfg: PreprocessConfig,
    spec: sources.DatasetSpec,
    sizes: dict[str, int],
    files: list[dict[str, Any]],
    staging: str,
) -> None:
    """The guard against a lossy runner: what was written must be exactly what the source and
    the plan say, split by split and file by file, before anything is published.

    Raises:
        PreprocessError: one line naming the split (or file) and both numbers.
    """
    held_out = EVAL_ROLE not in sizes
    plans = make_plans(cfg, spec, held_out)
    train = plans[TRAIN_ROLE](sizes[TRAIN_ROLE])
    written = {s: sum(f["num_examples"] for f in files if f["split"] == s) for s in layout.SPLITS}
    held = written[layout.TRAIN_SPLIT] + written[layout.VALIDATION_SPLIT]
    held += written[layout.EVAL_SPLIT] if held_out else 0
    if held != train.num_examples or (held_out and written[layout.EVAL_SPLIT] != train.num_eval):
        raise PreprocessError(
            f"split '{cfg.train_split}' has {train.num_examples} examples but the runner wrote "
            f"{held} (train {written[layout.TRAIN_SPLIT]} + validation and leftover "
            f"{written[layout.VALIDATION_SPLIT]}"
            + (f" + held-out eval {written[layout.EVAL_SPLIT]}" if held_out else "")
            + "): records were lost or repeated; nothing published"
        )
    if not held_out and written[layout.EVAL_SPLIT] != sizes[EVAL_ROLE]:
        raise PreprocessError(
            f"split '{cfg.eval_split}' has {sizes[EVAL_ROLE]} examples but the "
            f"runner wrote {written[layout.EVAL_SPLIT]}: records were lost or repeated; "
            "nothing published"
        )
    expected = {
        slot.path: sum(end - begin for begin, end in ranges)
        for role, size in sizes.items()
        for slot, ranges in plans[role](size).files()
    }
    paths = [f["path"] for f in files]
    if sorted(paths) != sorted(expected):
        missing = sorted(set(expected) - set(paths))
        extra = sorted({p for p in paths if paths.count(p) > 1} | (set(paths) - set(expected)))
        raise PreprocessError(
            f"the runner wrote {len(paths)} files, the plan has {len(expected)} "
            f"(missing {missing[:3]}, unexpected or repeated {extra[:3]}); nothing published"
        )
    for entry in files:
        on_disk = tf.io.gfile.stat(layout.join(staging, entry["path"])).length
        if entry["num_examples"] != expected[entry["path"]] or on_disk != entry["size_bytes"]:
            raise PreprocessError(
                f"file {entry['path']} holds {entry['num_examples']} examples in {on_disk} "
                f"bytes, the plan says {expected[entry['path']]} examples in "
                f"{entry['size_bytes']} bytes; nothing published"
            )


def held_out_by_image(
    cfg: PreprocessConfig, sizes: dict[str, int], files: list[dict[str, Any]]
) -> dict[str, int]:
    """The roles' sizes once the job held the eval split out of the train role by image digest:
    the train role less what went to eval, and the eval role.

    Raises:
        PreprocessError: the written splits do not add up to the train split (a lossy runner).
        BadInputError: no image fell in the held-out share.
    """
    n = sizes[TRAIN_ROLE]
    written = {s: sum(f["num_examples"] for f in files if f["split"] == s) for s in layout.SPLITS}
    if sum(written.values()) != n:
        raise PreprocessError(
            f"split '{cfg.train_split}' has {n} examples but the runner wrote "
            f"{sum(written.values())} (train {written[layout.TRAIN_SPLIT]} + validation and "
            f"leftover {written[layout.VALIDATION_SPLIT]} + held-out eval "
            f"{written[layout.EVAL_SPLIT]}): records were lost or repeated; nothing published"
        )
    if written[layout.EVAL_SPLIT] == 0:
        raise BadInputError(
            f"eval_fraction {cfg.eval_fraction} of the {n} examples of '{cfg.train_split}' "
            "held out no image: raise --eval_fraction or name an eval split with --eval_split"
        )
    return {TRAIN_ROLE: n - written[layout.EVAL_SPLIT], EVAL_ROLE: written[layout.EVAL_SPLIT]}


def _check_splits(cfg: PreprocessConfig, spec: sources.DatasetSpec, sizes: dict[str, int]) -> None:
    n = sizes[TRAIN_ROLE]
    held_out = EVAL_ROLE not in sizes
    if held_out and plan.num_held_out_eval_examples(n, cfg.eval_fraction) == 0:
        raise BadInputError(
            f"dataset '{spec.name}' has no '{cfg.eval_split}' split and eval_fraction "
            f"{cfg.eval_fraction} of the {n} examples of '{cfg.train_split}' holds out none: "
            "raise --eval_fraction or name an eval split with --eval_split"
        )
    if not held_out and sizes[EVAL_ROLE] == 0:
        raise BadInputError(f"eval split '{cfg.eval_split}' of '{spec.name}' holds no examples")
    train = plan.TrainPlan(n, 1, cfg.validation_fraction, 1, cfg.eval_fraction if held_out else 0)
    left = n - train.num_eval - train.num_validation
    if cfg.num_workers > left:
        raise BadInputError(
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
        UnsupportedStorageError: a path's scheme is neither local nor gs://; nothing done.
    """
    storage.check_supported(cfg.output_root)
    storage.check_supported(cfg.data_dir, "TFDS data dir")
    cfg.check()
    drops.check_config(cfg, datasets.parse(cfg.dataset)[0])
    beam_args = list(beam_args or [])
    options = beam_options(beam_args)
    data_dir = layout.data_dir(storage.absolute(cfg.output_root), cfg.date)
    manifest_path = layout.join(data_dir, layout.MANIFEST_FILE)
    if tf.io.gfile.exists(manifest_path) and not cfg.overwrite:
        raise PreprocessError(
            f"shard set already complete: {manifest_path} exists (pass --overwrite to replace it)"
        )
    shard_set.remove_dead_staging(data_dir)
    staging = shard_set.make_staging(data_dir)
    dask_cluster = contextlib.ExitStack()  # a local Dask cluster this run starts, if any
    try:
        source = datasets.open_source(cfg, storage.absolute(cfg.data_dir))
        spec = source.spec
        roles = resolve_roles(cfg, spec)
        sizes = role_sizes(roles)
        _check_splits(cfg, spec, sizes)
        # Files of the user's only: a TFDS dataset's files are TFDS's own, shared by every
        # split, and the job's count of eval images in the training data guards its splits.
        if source.files is not None and EVAL_ROLE in roles:
            known = {f["path"]: f["sha256"] for f in (source.drops or {}).get("files", [])}
            splits = (cfg.train_split, cfg.eval_split)
            source_overlap.check_disjoint(
                source.files, roles[TRAIN_ROLE], roles[EVAL_ROLE], splits, known
            )
        if dask_support.is_dask(options):
            examples = sum(sizes.values())
            beam_args = dask_support.prepare(
                beam_args, examples * record_bytes(spec), cfg.bucket_bytes, dask_cluster
            )
            options = beam_options(beam_args)
        try:
            with _make_pipeline(options) as p:
                _build_pipeline(p, cfg, source, roles, staging)
        except Exception as e:
            # A step that found bad input on a worker: its own line, not the runner's wrapping.
            own = from_runner_failure(e)
            if own is None:
                raise
            raise own from None
        files_path = layout.join(staging, FILES_LIST)
        if not tf.io.gfile.exists(files_path):
            raise PreprocessError(
                f"the runner finished without writing the file list {files_path}: "
                "it skipped the job's last step; nothing published"
            )
        counted, duplicates = eval_overlap.split_listing(atomic.read_json(files_path))
        files = [{k: v for k, v in f.items() if k != statistics.STATISTICS_KEY} for f in counted]
        by_image = datasets.holds_out_eval_by_image(cfg, spec)
        if by_image:
            sizes = held_out_by_image(cfg, sizes, files)
        check_written(cfg, spec, sizes, files, staging)
        eval_overlap.check_count(duplicates, cfg.max_eval_overlap)
        shard_set.keep_only(staging, [f["path"] for f in files])
        extra = {manifest.STATISTICS_KEY: write_statistics(counted, spec, staging)}
        if source.drops is not None:
            extra[manifest.DROPS_KEY] = source.drops
        doc = shard_set.build_manifest(
            cfg, spec, sizes, files, extra, duplicates=duplicates, eval_by_image=by_image
        )
        shard_set.publish(staging, data_dir, doc)
    finally:
        dask_cluster.close()
        shard_set.remove(staging)
    logging.info("wrote %d files and %s", len(doc["files"]), manifest_path)
    return doc


def write_statistics(
    counted: list[dict[str, Any]], spec: sources.DatasetSpec, staging: str
) -> dict[str, Any]:
    """Writes the shard set's statistics file; returns its manifest entry."""
    data = statistics.build(counted, spec.image_shape)
    atomic.write_bytes_atomic(layout.join(staging, manifest.STATISTICS_FILE), data)
    return {
        "path": manifest.STATISTICS_FILE,
        "format": "tensorflow_metadata DatasetFeatureStatisticsList (binary)",
        "sha256": hashlib.sha256(data).hexdigest(),
        "size_bytes": len(data),
    }
