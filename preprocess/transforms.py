"""The Beam steps of the stage: read TFDS in chunks, key records, rank them, write shard files.

Elements are batches (lists) of records, not single records, to keep Beam's per-element
overhead off the hot path.

Ranking without global state: a record's key is sha256(seed, record); its bucket is the key's
first bits, so bucket order is key order. Records are grouped by bucket; each bucket is sorted
and spilled to one staging file, and only its (count, bytes) travel on. From those few numbers
one step works out every record's global rank (the buckets before it plus its place inside)
and cuts the plan's files into byte ranges of the spilled buckets, which are then copied in
parallel (TFRecord files concatenate byte-wise). A worker holds at most one bucket at a time,
and the output does not depend on the number of buckets, the runner or the bundle order.

The graph is one chain ending in one step, uses no side inputs, tagged outputs or Beam sinks,
and writes files by absolute path through a temporary name: the constructs that Beam's
DaskRunner runs correctly (it computes only the last step, recomputes side inputs per
partition, and its file sinks lose data).
"""

from __future__ import annotations

import bisect
import collections
import hashlib
import math
import posixpath
import struct
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import apache_beam as beam
import tensorflow as tf

from contract import layout, records

Keyed = tuple[bytes, bytes]  # (sha256 key, serialised record)
BucketId = tuple[str, int]  # (source role: "train" or "eval", bucket number)
Piece = tuple[str, int, int]  # (spilled bucket file, first record, end record)
CopyTask = tuple[str, str, int | None, list[Piece]]  # (path, split, worker, pieces)
MakePlan = Callable[[int], Any]  # number of examples -> plan.TrainPlan / plan.WholeSplitPlan
BUCKETS_DIR = "_buckets"
MAX_BUCKET_BITS = 20


def read_chunks(split: str, num_examples: int, chunk_size: int) -> list[tuple[str, int, int]]:
    """Cuts a TFDS split into (split, start, end) ranges that readers take in parallel."""
    return [
        (split, s, min(s + chunk_size, num_examples)) for s in range(0, num_examples, chunk_size)
    ]


class ReadTfdsChunk(beam.DoFn):
    """Reads one range of a prepared TFDS split and emits batches of encoded records.

    TFRecord-backed datasets are parsed and decoded a batch at a time in one tf.data graph
    (TFDS's own per-example reader costs more than everything else in this stage); images go
    through tf.io.decode_image, the decoder TFDS's Image feature uses, so pixels match TFDS.
    Other file formats (array_record) fall back to TFDS's reader.
    """

    def __init__(self, dataset_dir: str, image_key: str, label_key: str, batch_size: int):
        self._dataset_dir = dataset_dir
        self._image_key = image_key
        self._label_key = label_key
        self._batch_size = batch_size
        self._builder: Any = None

    def setup(self) -> None:
        import tensorflow_datasets as tfds

        self._builder = tfds.builder_from_directory(self._dataset_dir)

    def process(self, chunk: tuple[str, int, int]) -> Iterator[list[bytes]]:
        split, start, end = chunk
        for batch in self._batches(f"{split}[{start}:{end}]"):
            images, labels = batch[self._image_key], batch[self._label_key]
            yield [
                records.encode_example(i, int(lbl)) for i, lbl in zip(images, labels, strict=True)
            ]

    def _batches(self, split: str) -> Iterator[dict[str, Any]]:
        import tensorflow_datasets as tfds

        info = self._builder.info
        if info.file_format != tfds.core.FileFormat.TFRECORD:
            dataset = self._builder.as_dataset(split=split, shuffle_files=False)
            yield from dataset.batch(self._batch_size).prefetch(1).as_numpy_iterator()
            return
        shape = info.features[self._image_key].shape
        spec = {
            self._image_key: tf.io.FixedLenFeature([], tf.string),
            self._label_key: tf.io.FixedLenFeature([], tf.int64),
        }

        def decode_image(encoded: tf.Tensor) -> tf.Tensor:
            # The decoder TFDS's Image feature uses, without its per-example Python wrapping.
            image = tf.io.decode_image(encoded, channels=shape[-1], expand_animations=False)
            return tf.ensure_shape(image, shape)

        @tf.autograph.experimental.do_not_convert
        def decode(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
            parsed = tf.io.parse_example(serialized, spec)
            images = tf.map_fn(
                decode_image,
                parsed[self._image_key],
                fn_output_signature=tf.TensorSpec(shape, tf.uint8),
                parallel_iterations=16,
            )
            return {self._image_key: images, self._label_key: parsed[self._label_key]}

        for instruction in info.splits[split].file_instructions:
            dataset = tf.data.TFRecordDataset(instruction.filename)
            dataset = dataset.skip(instruction.skip).take(instruction.take)
            dataset = dataset.batch(self._batch_size).map(
                decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
            )
            yield from dataset.prefetch(1).as_numpy_iterator()


def key_records(batch: list[bytes], seed: str) -> list[Keyed]:
    """Pairs each record with sha256(seed, record), the key that orders it."""
    prefix = hashlib.sha256(seed.encode())
    keyed = []
    for record in batch:
        digest = prefix.copy()
        digest.update(record)
        keyed.append((digest.digest(), record))
    return keyed


def bucket_bits(num_examples: int, record_bytes: int, bucket_bytes: int, min_buckets: int) -> int:
    """Bits of key prefix per bucket: enough buckets that one holds about `bucket_bytes`."""
    wanted = max(min_buckets, math.ceil(num_examples * record_bytes / max(1, bucket_bytes)))
    return min(MAX_BUCKET_BITS, max(0, math.ceil(math.log2(max(1, wanted)))))


def bucket_of(key: bytes, bits: int) -> int:
    """The bucket of a key: its first `bits` bits (0 when there is one bucket)."""
    return int.from_bytes(key[:4], "big") >> (32 - bits) if bits else 0


class KeyIntoBuckets(beam.DoFn):
    """A batch of records → (bucket id, the batch's keyed records of that bucket) pieces."""

    def __init__(self, role: str, seed: str, bits: int):
        self._role = role
        self._seed = seed
        self._bits = bits

    def process(self, batch: list[bytes]) -> Iterator[tuple[BucketId, list[Keyed]]]:
        parts: dict[int, list[Keyed]] = collections.defaultdict(list)
        for keyed in key_records(batch, self._seed):
            parts[bucket_of(keyed[0], self._bits)].append(keyed)
        for bucket in sorted(parts):
            yield (self._role, bucket), parts[bucket]


def bucket_path(staging_dir: str, role: str, bucket: int) -> str:
    """Where a sorted bucket is spilled inside the staging folder."""
    return layout.join(staging_dir, BUCKETS_DIR, role, f"{bucket:07d}.tfrecord")


def write_file_atomic(path: str, write: Callable[[str], None]) -> None:
    """`write(temporary path)`, then a rename: a retried task never leaves half a file."""
    tf.io.gfile.makedirs(posixpath.dirname(path))
    temp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        write(temp)
        tf.io.gfile.rename(temp, path, overwrite=True)
    finally:
        if tf.io.gfile.exists(temp):
            tf.io.gfile.remove(temp)


class SortBucket(beam.DoFn):
    """Sorts one bucket's records by (key, record), spills them as TFRecords, emits its size.

    Identical records share a key and land next to each other, each with its own rank.
    """

    def __init__(self, staging_dir: str):
        self._staging_dir = staging_dir

    def process(self, element: tuple[BucketId, Iterable[list[Keyed]]]) -> Iterator[dict[str, Any]]:
        (role, bucket), parts = element
        keyed = sorted(k for part in parts for k in part)
        path = bucket_path(self._staging_dir, role, bucket)

        def write(temp: str) -> None:
            with tf.io.TFRecordWriter(temp) as writer:
                for _, record in keyed:
                    writer.write(record)

        write_file_atomic(path, write)
        yield {"role": role, "bucket": bucket, "count": len(keyed), "path": path}


def record_offsets(data: bytes) -> list[int]:
    """Byte offset of every record in a TFRecord file's bytes, plus the end offset."""
    offsets, pos = [], 0
    while pos < len(data):
        offsets.append(pos)
        (length,) = struct.unpack_from("<Q", data, pos)
        pos += 16 + length
    if pos != len(data):
        raise ValueError(f"truncated TFRecord data: {len(data)} bytes, last record ends at {pos}")
    offsets.append(pos)
    return offsets


def plan_copies(stats: list[dict[str, Any]], make_plans: dict[str, MakePlan]) -> list[CopyTask]:
    """Every output file of every role, as pieces (byte ranges by record) of spilled buckets.

    Buckets are in key order, so bucket b's records have the global ranks
    [records in buckets < b, ... + count_b); a file's rank ranges are cut at bucket edges.
    """
    tasks: list[CopyTask] = []
    for role, make_plan in sorted(make_plans.items()):
        buckets = sorted((s["bucket"], s["count"], s["path"]) for s in stats if s["role"] == role)
        starts = [0]
        for _, count, _ in buckets:
            starts.append(starts[-1] + count)
        for slot, ranges in make_plan(starts[-1]).files():
            pieces: list[Piece] = []
            for begin, end in ranges:
                i = bisect.bisect_right(starts, begin) - 1
                while begin < end:
                    first, (_, count, path) = starts[i], buckets[i]
                    stop = min(end, first + count)
                    pieces.append((path, begin - first, stop - first))
                    begin, i = stop, i + 1
            tasks.append((slot.path, slot.split, slot.worker, pieces))
    return tasks


class WriteFile(beam.DoFn):
    """Writes one output file from its pieces; emits its manifest file entry."""

    def __init__(self, staging_dir: str):
        self._staging_dir = staging_dir
        self._cached: tuple[str, bytes, list[int]] | None = None

    def _bucket(self, path: str) -> tuple[bytes, list[int]]:
        if self._cached is None or self._cached[0] != path:
            self._cached = None  # let the previous bucket go before reading the next
            with tf.io.gfile.GFile(path, "rb") as f:
                data = f.read()
            self._cached = (path, data, record_offsets(data))
        return self._cached[1], self._cached[2]

    def process(self, task: CopyTask) -> Iterator[dict[str, Any]]:
        path, split, worker, pieces = task
        written: dict[str, Any] = {}

        def write(temp: str) -> None:
            digest, size, count = hashlib.sha256(), 0, 0
            with tf.io.gfile.GFile(temp, "wb") as f:
                f.write(b"")  # an empty file exists too (GFile creates on first write)
                for bucket, first, end in pieces:
                    data, offsets = self._bucket(bucket)
                    if end >= len(offsets):
                        raise ValueError(f"{bucket} holds {len(offsets) - 1} records, not {end}")
                    chunk = data[offsets[first] : offsets[end]]
                    f.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
                    count += end - first
            # What the file that is renamed into place holds, whatever an earlier try wrote.
            written.update(num_examples=count, sha256=digest.hexdigest(), size_bytes=size)

        write_file_atomic(layout.join(self._staging_dir, path), write)
        yield {"path": path, "split": split, "worker": worker, **written}


class ShardSplits(beam.PTransform):
    """Batches of records per source role → file entries of the shard files written for them.

    Args:
        roles: role ("train", "eval") → (plan maker: number of examples → plan, bucket bits).
        seed: mixed into every key, so a different seed gives a different assignment.
        staging_dir: absolute folder the files are written into (buckets under `_buckets/`).
    """

    def __init__(self, roles: dict[str, tuple[MakePlan, int]], seed: str, staging_dir: str):
        super().__init__()
        self._roles = roles
        self._seed = seed
        self._staging_dir = staging_dir

    def expand(self, batches: dict[str, beam.PCollection]) -> beam.PCollection:
        keyed = [
            batches[role]
            | f"Key{role.title()}" >> beam.ParDo(KeyIntoBuckets(role, self._seed, bits))
            for role, (_, bits) in sorted(self._roles.items())
        ]
        make_plans = {role: make_plan for role, (make_plan, _) in self._roles.items()}
        return (
            keyed
            | "MergeBuckets" >> beam.Flatten()
            | "GroupByBucket" >> beam.GroupByKey()
            | "SortBuckets" >> beam.ParDo(SortBucket(self._staging_dir))
            | "GatherBucketSizes"
            >> beam.CombineGlobally(beam.combiners.ToListCombineFn()).without_defaults()
            | "PlanCopies" >> beam.FlatMap(plan_copies, make_plans=make_plans)
            | "DistributeCopies" >> beam.Reshuffle()
            | "WriteFiles" >> beam.ParDo(WriteFile(self._staging_dir))
        )
