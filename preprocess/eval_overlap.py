"""Eval examples whose image is also in the training data, counted in the Beam job by image hash.

An example's identity is the sha256 of its image bytes (the raw uint8 pixels of
`contract.records`), whatever its label. `CountEvalDuplicates` reads every written shard file
once, cuts each file's digests by their first bits into buckets, groups the buckets, and counts
in each one the eval digests that are also train or validation digests; the buckets' counts are
summed. Sets and sums: the count does not depend on the runner, the bucketing or bundle order,
and one worker holds one bucket of digests at a time.

The same digest decides the held-out eval split of daily drops (`is_held_out`): an image is
eval every night it is in the window, so no example moves from one night's training data into
a later night's eval split.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam

from contract import layout, records
from preprocess.errors import BadInputError, PreprocessError

# Marks the count among the file entries the job lists (`pipeline.FILES_LIST`).
DUPLICATES_KEY = "eval_duplicates_in_training"
DIGEST_BYTES = 32
READ_BATCH = 4096
_SCALE = float(1 << 64)

DigestPart = tuple[bool, bytes]  # (whether from the eval split, concatenated digests)


def image_digest(record: bytes) -> bytes:
    """sha256 of the image bytes of one serialised record (contract.records)."""
    from tensorflow.core.example import example_pb2

    example = example_pb2.Example.FromString(record)
    image = example.features.feature[records.IMAGE_KEY].bytes_list.value[0]
    return hashlib.sha256(image).digest()


def is_held_out(digest: bytes, fraction: float) -> bool:
    """Whether an image with this digest belongs to a held-out share `fraction` of all images:
    its digest's first 8 bytes, read as a number in [0, 1), fall below the fraction."""
    return int.from_bytes(digest[:8], "big") / _SCALE < fraction


def bucket_of(digest: bytes, bits: int) -> int:
    """A digest's bucket: its first `bits` bits (0 when there is one bucket)."""
    return int.from_bytes(digest[:4], "big") >> (32 - bits) if bits else 0


def file_digests(path: str) -> Iterator[bytes]:
    """The image digest of every record of a shard file, in file order."""
    import tensorflow as tf

    spec = {records.IMAGE_KEY: tf.io.FixedLenFeature([], tf.string)}
    dataset = (
        tf.data.TFRecordDataset(path)
        .batch(READ_BATCH)
        .map(
            tf.autograph.experimental.do_not_convert(
                lambda s: tf.io.parse_example(s, spec)[records.IMAGE_KEY]
            )
        )
    )
    for images in dataset.as_numpy_iterator():
        for image in images:
            yield hashlib.sha256(image).digest()


def digest_buckets(
    entry: dict[str, Any], staging_dir: str, bits: int
) -> Iterator[tuple[int, DigestPart]]:
    """One written file's image digests by bucket: (bucket, (is eval, digests)) per bucket the
    file touches, and one empty part for an empty file, so every file is heard from."""
    is_eval = entry["split"] == layout.EVAL_SPLIT
    parts: dict[int, list[bytes]] = collections.defaultdict(list)
    for digest in file_digests(layout.join(staging_dir, entry["path"])):
        parts[bucket_of(digest, bits)].append(digest)
    if not parts:
        yield 0, (is_eval, b"")
    for bucket in sorted(parts):
        yield bucket, (is_eval, b"".join(sorted(parts[bucket])))


def count_bucket(element: tuple[int, Iterable[DigestPart]]) -> int:
    """The eval digests of one bucket that are also train or validation digests (an eval image
    that is there twice counts twice)."""
    _, parts = element
    training: set[bytes] = set()
    held: list[bytes] = []
    for is_eval, blob in parts:
        digests = [blob[i : i + DIGEST_BYTES] for i in range(0, len(blob), DIGEST_BYTES)]
        if is_eval:
            held.extend(digests)
        else:
            training.update(digests)
    return sum(1 for digest in held if digest in training)


class CountEvalDuplicates(beam.PTransform):
    """Written file entries → one element, `{DUPLICATES_KEY: n}`: the eval examples whose image
    is also a train or validation example's.

    Args:
        staging_dir: the folder the entries' paths are relative to.
        bits: digest bits per bucket (2**bits buckets).
    """

    def __init__(self, staging_dir: str, bits: int):
        super().__init__()
        self._staging_dir = staging_dir
        self._bits = bits

    def expand(self, entries: beam.PCollection) -> beam.PCollection:
        return (
            entries
            | "HashImages"
            >> beam.FlatMap(digest_buckets, staging_dir=self._staging_dir, bits=self._bits)
            | "GroupDigestsByBucket" >> beam.GroupByKey()
            | "CountBucketDuplicates" >> beam.Map(count_bucket)
            | "SumDuplicates" >> beam.CombineGlobally(sum).without_defaults()
            | "NameCount" >> beam.Map(lambda count: {DUPLICATES_KEY: count})
        )


def split_listing(listed: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The job's list of results: (the file entries, the count of `CountEvalDuplicates`).

    Raises:
        PreprocessError: the list holds no count, or more than one (a lossy runner).
    """
    counts = [e[DUPLICATES_KEY] for e in listed if DUPLICATES_KEY in e]
    if len(counts) != 1:
        raise PreprocessError(
            f"the runner listed {len(counts)} counts of eval examples also in the training "
            "data, not 1: a step was skipped or repeated; nothing published"
        )
    return [e for e in listed if DUPLICATES_KEY not in e], counts[0]


def check_count(duplicates: int, max_eval_overlap: int) -> None:
    """Refuses an eval split with more examples also in the training data than allowed.

    Raises:
        BadInputError: naming the count, the limit and what to do.
    """
    if duplicates > max_eval_overlap:
        raise BadInputError(
            f"the eval split holds {duplicates} examples whose image is also in the training "
            f"data (train and validation), more than max_eval_overlap {max_eval_overlap}: "
            "remove them from one side, or raise --max_eval_overlap; nothing published"
        )
