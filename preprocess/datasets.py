"""The `--dataset` value: which adapter reads the images, and the source it opens.

    fashion_mnist, name/config          a dataset registered in TFDS
    tfds:my_pkg.my_module[:MyBuilder]   a TFDS builder of the user's, imported by path
    imagefolder:ROOT                    ROOT/<class name>/*.png|jpg (or ROOT/<split>/<class>/...)
    tfrecord:[SPLIT=]PATTERN[,...]      files of tf.train.Example (image and label features)
    drops:[SPLIT=]PATTERN[,...]         the same, in dated daily drops read as a rolling window
                                        (PATTERN with {YYYY}, {MM}, {DD}; see preprocess.drops)

Every adapter ends in the same place: a `DatasetSpec` (shape, classes, split sizes) and a
range reader the Beam job reads chunks through, so sharding, the manifest and evaluation do
not depend on where the images came from.
"""

from __future__ import annotations

import dataclasses
import re
import types
from typing import Any

import tensorflow_datasets as tfds

from preprocess import drops, image_folder, reading, sources, tfrecord_source
from preprocess.config import DEFAULT_EVAL_SPLIT, PreprocessConfig
from preprocess.errors import BadInputError
from preprocess.images import ImageShaper

TFDS = "tfds"
ADAPTERS = (TFDS, image_folder.ADAPTER, tfrecord_source.ADAPTER, drops.ADAPTER)
_ADAPTER_PREFIX = re.compile(r"([A-Za-z][A-Za-z0-9_]*):(.*)", re.DOTALL)
_VERSION = re.compile(r"[0-9]+(\.[0-9*]+)*")


@dataclasses.dataclass(frozen=True)
class Source:
    """An opened dataset: what it holds, the reader of its splits' ranges, (daily drops) the
    manifest's record of the days and files read, and (datasets of the user's files) each own
    split's files in reading order with their number of examples.

    A TFDS dataset has no files of the user's (`files` is None): TFDS writes its own, and the
    Beam job's count of eval images also in the training data is what guards its splits.
    """

    spec: sources.DatasetSpec
    reader: reading.RangeReader
    drops: dict[str, Any] | None = None
    files: dict[str, list[tuple[str, int]]] | None = None


def parse(dataset: str) -> tuple[str, str]:
    """(adapter, what it reads) of a `--dataset` value.

    A value without an adapter prefix is a registered TFDS name ('name', 'name/config',
    'name:1.0.0').

    Raises:
        BadInputError: the prefix names no adapter.
    """
    prefixed = _ADAPTER_PREFIX.fullmatch(dataset)
    if not prefixed or _VERSION.fullmatch(prefixed.group(2)):
        return TFDS, dataset
    adapter, target = prefixed.group(1), prefixed.group(2)
    if adapter not in ADAPTERS:
        raise BadInputError(
            f"unknown dataset adapter '{adapter}' in --dataset {dataset}: use a TFDS name or "
            f"one of {', '.join(a + ':' for a in ADAPTERS)} (see docs/extending.md)"
        )
    if not target:
        raise BadInputError(f"--dataset {dataset} names no {adapter} source after '{adapter}:'")
    return adapter, target


def open_source(cfg: PreprocessConfig, data_dir: str) -> Source:
    """Prepares (TFDS) or lists and scans (image folder, TFRecord) the dataset of `cfg`.

    Args:
        cfg: the stage's parameters.
        data_dir: the TFDS data folder, absolute.

    Raises:
        BadInputError: the dataset is unusable as named, naming what is wrong.
        PreprocessError: its files cannot be prepared.
    """
    adapter, target = parse(cfg.dataset)
    resize = cfg.resize_shape()
    if adapter == TFDS:
        if resize is not None or cfg.raw_image_shape:
            raise BadInputError(
                "--resize and --raw_image_shape apply to imagefolder: and tfrecord: datasets; "
                "a TFDS dataset's images have the shape its Image feature declares"
            )
        builder = sources.prepare_dataset(
            cfg.dataset, data_dir, cfg.manual_dir, cfg.manual_checksums
        )
        spec = sources.describe(builder)
        if cfg.dataset.startswith(f"{TFDS}:"):  # the name Evaluate and FullRun compare
            spec = dataclasses.replace(spec, name=cfg.dataset)
        reader: reading.RangeReader = reading.TfdsRangeReader(
            spec.dataset_dir, spec.image_key, spec.label_key, cfg.batch_size
        )
        return Source(spec, reader)
    if adapter == image_folder.ADAPTER:
        listing, class_names = image_folder.list_folder(target)
        reference, shape = image_folder.reference_image(listing, _base(cfg.train_split))
        shaper = ImageShaper(reference, shape, resize)
        spec = _spec(
            cfg.dataset,
            adapter,
            image_folder.listing_version(listing),
            shaper,
            class_names,
            {split: len(files) for split, files in listing.items()},
        )
        reader = image_folder.ImageFolderReader(listing, shaper, cfg.batch_size)
        files = {split: [(path, 1) for path, _ in images] for split, images in listing.items()}
        return Source(spec, reader, files=files)
    fmt = tfrecord_source.ExampleFormat(cfg.image_feature, cfg.label_feature, cfg.raw_shape())
    window: drops.Window | None = None
    hashed: dict[str, str] | None = None
    if adapter == drops.ADAPTER:
        window = drops.select_window(target, cfg)
        drops.check_files(window, fmt, resize is not None)
        hashed = drops.check_sums(window)
        patterns = window.file_lists()
    else:
        patterns = tfrecord_source.parse_patterns(target)
    scanned = tfrecord_source.open_files(patterns, fmt)
    reference, shape = tfrecord_source.reference_image(scanned, fmt, _base(cfg.train_split))
    shaper = ImageShaper(reference, shape, resize)
    sizes = {split: sum(count for _, count in files) for split, files in scanned.files.items()}
    spec = _spec(cfg.dataset, adapter, scanned.version, shaper, scanned.class_names, sizes)
    if window is None:
        reader = tfrecord_source.TFRecordReader(scanned, fmt, shaper, cfg.batch_size)
        return Source(spec, reader, files=scanned.files)
    days = {path: day for files in window.files.values() for path, day in files}
    reader = tfrecord_source.TFRecordReader(scanned, fmt, shaper, cfg.batch_size, days)
    counts = {path: count for files in scanned.files.values() for path, count in files}
    described = drops.describe(window, counts, drops.window_days(cfg), hashed)
    return Source(spec, reader, described, scanned.files)


def _base(split_expression: str) -> str:
    """The first own split an expression names ('train' of 'train[:90%]+extra')."""
    return re.split(r"[\[+]", split_expression, maxsplit=1)[0].strip()


def _spec(
    name: str,
    adapter: str,
    version: str,
    shaper: ImageShaper,
    class_names: list[str],
    split_sizes: dict[str, int],
) -> sources.DatasetSpec:
    return sources.DatasetSpec(
        name=name,
        version=version,
        dataset_dir="",
        image_key="",
        label_key="",
        image_shape=shaper.shape,
        class_names=class_names,
        split_sizes=split_sizes,
        adapter=adapter,
    )


def holds_out_eval(cfg: PreprocessConfig, spec: sources.DatasetSpec) -> bool:
    """Whether the eval split is cut from the train split: the default eval split was asked
    for and the dataset has none."""
    return cfg.eval_split == DEFAULT_EVAL_SPLIT and DEFAULT_EVAL_SPLIT not in spec.split_sizes


def holds_out_eval_by_image(cfg: PreprocessConfig, spec: sources.DatasetSpec) -> bool:
    """Whether the held-out eval split is chosen by each image's digest rather than by rank:
    for daily drops, whose window moves, so that an image never goes from one night's training
    data to a later night's eval split (`eval_overlap.is_held_out`)."""
    return holds_out_eval(cfg, spec) and spec.adapter == drops.ADAPTER


def resolve_split(spec: sources.DatasetSpec, expression: str) -> list[reading.SplitRange]:
    """The ranges of the dataset's own splits a TFDS split expression names, in order.

    Raises:
        BadInputError: the expression is malformed or names a split the dataset lacks.
    """
    infos = {
        name: types.SimpleNamespace(num_examples=size, shard_lengths=[size])
        for name, size in spec.split_sizes.items()
    }
    try:
        instructions = tfds.core.ReadInstruction.from_spec(expression).to_absolute(infos)
    except (ValueError, AssertionError) as e:
        reason = " ".join(str(e).split())
        splits = ", ".join(f"{s} ({n} examples)" for s, n in sorted(spec.split_sizes.items()))
        if "Unknown split" in reason:
            problem = f"has no split '{_unknown_split(reason, expression)}'"
        else:
            problem = f"cannot read split '{expression}' ({reason})"
        raise BadInputError(f"dataset '{spec.name}' {problem}; it has {splits}") from None
    return [
        (
            i.splitname,
            i.from_ or 0,
            spec.split_sizes[i.splitname] if i.to is None else i.to,
        )
        for i in instructions
    ]


def _unknown_split(reason: str, expression: str) -> str:
    found = re.search(r"Unknown split '([^']*)'", reason)
    return found.group(1) if found else expression
