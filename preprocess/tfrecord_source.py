"""The TFRecord adapter: files of tf.train.Example with a named image and label feature.

The image feature holds one encoded image (PNG, JPEG, GIF, BMP: anything tf.io.decode_image
reads), or raw uint8 pixels of a shape given as `raw_image_shape` (the shard format's own
`image` feature is such). The label feature holds an int64 class index (classes are named '0',
'1', ... up to the largest index) or a bytes class name (classes are the sorted names).

`open_files` takes an explicit list of file patterns per split, so a caller that picks the files
itself (a rolling window of daily drops) reads them exactly as `--dataset tfrecord:...` does.
Paths go through tf.io.gfile, so patterns may be gs:// globs.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from contract import records
from preprocess.errors import BadInputError
from preprocess.images import ImageShaper, decode

ADAPTER = "tfrecord"
DEFAULT_SPLIT = "train"
SCAN_BATCH = 4096
SCAN_THREADS = 8
INT_LABEL, NAME_LABEL = "int64", "bytes"
_SPLIT_PREFIX = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.+)")
_MISSING_FEATURE = re.compile(r"Feature: (.+?) \(data type: \w+\) is required")


@dataclasses.dataclass(frozen=True)
class ExampleFormat:
    """Where a tf.train.Example keeps its image and label, and how the image is stored."""

    image_feature: str = records.IMAGE_KEY
    label_feature: str = records.LABEL_KEY
    raw_image_shape: list[int] | None = None  # None: encoded image bytes


@dataclasses.dataclass(frozen=True)
class TFRecordFiles:
    """The scanned files of a dataset: what the spec and the reader need."""

    files: dict[str, list[tuple[str, int]]]  # split -> [(file, number of records)], in order
    label_kind: str  # INT_LABEL or NAME_LABEL
    class_names: list[str]
    version: str


def parse_patterns(target: str) -> dict[str, list[str]]:
    """'train=a/*.tfrecord,test=b/*.tfrecord' or 'a/*.tfrecord' (all `train`) by split.

    Raises:
        BadInputError: no pattern is given.
    """
    by_split: dict[str, list[str]] = {}
    for item in (part.strip() for part in target.split(",")):
        if not item:
            continue
        named = _SPLIT_PREFIX.fullmatch(item)
        split, pattern = (named.group(1), named.group(2)) if named else (DEFAULT_SPLIT, item)
        by_split.setdefault(split, []).append(pattern)
    if not by_split:
        raise BadInputError(
            "tfrecord: names no files: pass --dataset tfrecord:PATTERN or "
            "tfrecord:train=PATTERN,test=PATTERN"
        )
    return by_split


def list_files(patterns: dict[str, list[str]]) -> dict[str, list[str]]:
    """The files the patterns match, by split, sorted and without repeats.

    Raises:
        BadInputError: naming a pattern that matches no file.
    """
    files = {}
    for split, split_patterns in patterns.items():
        found: set[str] = set()
        for pattern in split_patterns:
            matched = tf.io.gfile.glob(pattern)
            if not matched:
                raise BadInputError(f"no TFRecord file matches {pattern} (split '{split}')")
            found.update(matched)
        files[split] = sorted(found)
    return files


def _first_example(path: str) -> tf.train.Example | None:
    try:
        for record in tf.data.TFRecordDataset(path).take(1):
            return tf.train.Example.FromString(record.numpy())
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
        raise BadInputError(f"TFRecord file {path} is not readable: {_reason(e)}") from None
    except Exception as e:  # noqa: BLE001 - a record that is not a tf.train.Example
        raise BadInputError(f"TFRecord file {path} holds no tf.train.Example: {e}") from None
    return None


def _reason(error: Exception) -> str:
    return " ".join(str(getattr(error, "message", error)).split())[:200]


def _label_kind(path: str, example: tf.train.Example, fmt: ExampleFormat) -> str:
    """The label's type in the first example of `path`; checks both features are there.

    Raises:
        BadInputError: a feature is missing or of an unusable type, naming the file.
    """
    features = example.features.feature
    for role, name in (("label", fmt.label_feature), ("image", fmt.image_feature)):
        if name not in features:
            raise BadInputError(
                f"TFRecord file {path} has no {role} feature '{name}' (its features: "
                f"{', '.join(sorted(features)) or 'none'}): pass --{role}_feature NAME"
            )
    if features[fmt.image_feature].WhichOneof("kind") != "bytes_list":
        raise BadInputError(
            f"TFRecord file {path}: image feature '{fmt.image_feature}' is not bytes "
            "(encoded image or raw uint8 pixels)"
        )
    kind = features[fmt.label_feature].WhichOneof("kind")
    if kind == "int64_list":
        return INT_LABEL
    if kind == "bytes_list":
        return NAME_LABEL
    raise BadInputError(
        f"TFRecord file {path}: label feature '{fmt.label_feature}' is {kind}, "
        "not an int64 class index or a bytes class name"
    )


def _parse_spec(fmt: ExampleFormat, kind: str) -> dict[str, tf.io.FixedLenFeature]:
    return {
        fmt.image_feature: tf.io.FixedLenFeature([], tf.string),
        fmt.label_feature: tf.io.FixedLenFeature([], tf.int64 if kind == INT_LABEL else tf.string),
    }


def _parse_error(path: str, error: Exception, fmt: ExampleFormat) -> BadInputError:
    missing = _MISSING_FEATURE.search(str(getattr(error, "message", error)))
    if missing:
        role = "label" if missing.group(1) == fmt.label_feature else "image"
        return BadInputError(
            f"a record of TFRecord file {path} has no {role} feature '{missing.group(1)}': "
            "every record needs the image and the label"
        )
    return BadInputError(f"TFRecord file {path} is not readable: {_reason(error)}")


def _scan_file(path: str, fmt: ExampleFormat, kind: str) -> tuple[int, set[Any]]:
    """(number of records, set of labels) of one file, read in one pass."""
    spec = _parse_spec(fmt, kind)
    label = fmt.label_feature
    dataset = (
        tf.data.TFRecordDataset(path, buffer_size=8 << 20)
        .batch(SCAN_BATCH)
        .map(
            tf.autograph.experimental.do_not_convert(lambda s: tf.io.parse_example(s, spec)[label])
        )
    )
    count, labels = 0, set()
    try:
        for batch in dataset.as_numpy_iterator():
            count += len(batch)
            labels.update(np.unique(batch).tolist())
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
        raise _parse_error(path, e, fmt) from None
    return count, labels


def open_files(patterns: dict[str, list[str]], fmt: ExampleFormat) -> TFRecordFiles:
    """Lists and scans the files of every split once: record counts and the classes.

    Raises:
        BadInputError: a pattern matches nothing, or a file lacks a feature, holds labels of
            another type, a negative label, or is corrupt; naming the file.
    """
    by_split = list_files(patterns)
    every_file = [path for split in sorted(by_split) for path in by_split[split]]
    first = next(
        ((path, ex) for path in every_file if (ex := _first_example(path)) is not None), None
    )
    if first is None:
        raise BadInputError(f"the TFRecord files {', '.join(every_file[:3])} hold no records")
    kind = _label_kind(first[0], first[1], fmt)
    with concurrent.futures.ThreadPoolExecutor(SCAN_THREADS) as pool:
        scanned = dict(zip(every_file, pool.map(lambda p: _scan_file(p, fmt, kind), every_file),
                           strict=True))  # fmt: skip
    class_names = _class_names(kind, {path: found for path, (_, found) in scanned.items()})
    if len(class_names) < 2:
        raise BadInputError(
            f"the TFRecord files hold one class ({class_names[0]!r}): a classifier needs at "
            "least two"
        )
    digest = hashlib.sha256()
    for path in every_file:
        digest.update(f"{path}\0{scanned[path][0]}\n".encode())
    total = sum(count for count, _ in scanned.values())
    return TFRecordFiles(
        files={s: [(p, scanned[p][0]) for p in paths] for s, paths in by_split.items()},
        label_kind=kind,
        class_names=class_names,
        version=f"{len(every_file)} files, {total} records, "
        f"listing sha256 {digest.hexdigest()[:16]}",
    )


def _class_names(kind: str, labels_by_file: dict[str, set[Any]]) -> list[str]:
    """'0'..'<largest index>' for int64 labels, the sorted names for bytes labels.

    Raises:
        BadInputError: an int64 label is negative, naming its file.
    """
    labels: set[Any] = set().union(*labels_by_file.values())
    if kind == NAME_LABEL:
        return sorted(label.decode() for label in labels)
    for path, found in labels_by_file.items():
        if found and min(found) < 0:
            raise BadInputError(
                f"TFRecord file {path} has a negative label {min(found)}: int64 labels are "
                "class indices from 0"
            )
    return [str(i) for i in range(int(max(labels)) + 1)]


def decode_image(data: bytes, fmt: ExampleFormat, channels: int, source: str) -> np.ndarray:
    """One example's image bytes as uint8 HxWxC.

    Raises:
        BadInputError: raw bytes of another size than `raw_image_shape`, or undecodable bytes.
    """
    if fmt.raw_image_shape is None:
        return decode(data, channels, source)
    expected = int(np.prod(fmt.raw_image_shape))
    if len(data) != expected:
        shape = "x".join(map(str, fmt.raw_image_shape))
        raise BadInputError(
            f"a record of {source} holds {len(data)} image bytes, raw_image_shape {shape} "
            f"needs {expected}"
        )
    return np.frombuffer(data, np.uint8).reshape(fmt.raw_image_shape)


def describe_first_record(path: str, fmt: ExampleFormat) -> tuple[str | None, list[int]]:
    """(label kind, image [H, W, C]) of a file's first record; (None, []) for an empty file.

    Raises:
        BadInputError: the file is corrupt, or its first record lacks a feature, has one of an
            unusable type, or an image that does not decode; naming the file.
    """
    example = _first_example(path)
    if example is None:
        return None, []
    kind = _label_kind(path, example, fmt)
    data = example.features.feature[fmt.image_feature].bytes_list.value[0]
    return kind, list(decode_image(data, fmt, 0, path).shape)


def reference_image(
    scanned: TFRecordFiles, fmt: ExampleFormat, train_split: str
) -> tuple[str, list[int]]:
    """Names the first record of the train split (or of the first split) and its [H, W, C]."""
    split = train_split if train_split in scanned.files else sorted(scanned.files)[0]
    path = next(p for p, count in scanned.files[split] if count)
    example = _first_example(path)
    assert example is not None
    data = example.features.feature[fmt.image_feature].bytes_list.value[0]
    source = f"the first record of {path}"
    return source, list(decode_image(data, fmt, 0, source).shape)


class TFRecordReader:
    """Reads a range of one split's records (across its files, in order) as encoded records.

    With `days` (file -> the day of the drop it belongs to, for daily drops), each record of a
    dated file carries its day (contract.records.DAY_KEY).
    """

    def __init__(
        self,
        scanned: TFRecordFiles,
        fmt: ExampleFormat,
        shaper: ImageShaper,
        batch_size: int,
        days: dict[str, str | None] | None = None,
    ):
        self._files = scanned.files
        self._days = days or {}
        self._kind = scanned.label_kind
        self._index = {name: i for i, name in enumerate(scanned.class_names)}
        self._fmt = fmt
        self._shaper = shaper
        self._batch_size = batch_size

    def setup(self) -> None:
        pass

    def read_range(self, split: str, start: int, end: int) -> Iterator[list[bytes]]:
        offset = 0
        for path, count in self._files[split]:
            begin, finish = max(start, offset), min(end, offset + count)
            if begin < finish:
                yield from self._read_file(path, begin - offset, finish - begin)
            offset += count

    def _read_file(self, path: str, skip: int, take: int) -> Iterator[list[bytes]]:
        spec = _parse_spec(self._fmt, self._kind)
        dataset = (
            tf.data.TFRecordDataset(path, buffer_size=8 << 20)
            .skip(skip)
            .take(take)
            .batch(self._batch_size)
            .map(tf.autograph.experimental.do_not_convert(lambda s: tf.io.parse_example(s, spec)))
        )
        channels = self._shaper.shape[2]
        day = self._days.get(path)
        try:
            for batch in dataset.as_numpy_iterator():
                out = []
                for data, label in zip(
                    batch[self._fmt.image_feature], batch[self._fmt.label_feature], strict=True
                ):
                    image = decode_image(data, self._fmt, channels, f"a record of {path}")
                    image = self._shaper.conform(image, f"a record of {path}")
                    index = int(label) if self._kind == INT_LABEL else self._index[label.decode()]
                    out.append(records.encode_example(image, index, day))
                yield out
        except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
            raise _parse_error(path, e, self._fmt) from None
