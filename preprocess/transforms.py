"""The Beam steps of the stage: key records, spill them by bucket, rank them, write shard files.

Ranking without global state: a record's key is sha256(seed, record); its bucket is the key's
first bits, so bucket order is key order. The step that reads a chunk keys its records and
writes them, one fragment file per bucket the chunk touches, under `_fragments/`; only (bucket,
fragment path, count) travels on, so the records themselves never go through the runner's
shuffle. The fragment paths are grouped by bucket; each bucket's fragments are read, sorted and
spilled to one staging file, and only its (count, path) travel on. From those few numbers one
step works out every record's global rank (the buckets before it plus its place inside) and
cuts the plan's files into byte ranges of the spilled buckets, which are then copied in
parallel (TFRecord files concatenate byte-wise). A worker holds one read chunk or one bucket
at a time, and the output does not depend on the number of buckets, the chunking, the runner
or the bundle order.

The graph is one chain ending in one step, uses no side inputs, tagged outputs or Beam sinks,
and writes files by absolute path through a temporary name: the constructs that Beam's
DaskRunner runs correctly (it computes only the last step, recomputes side inputs per
partition, and its file sinks lose data).
"""

from __future__ import annotations

import bisect
import collections
import functools
import hashlib
import math
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import apache_beam as beam
import tensorflow as tf

from contract import layout
from contract.atomic import write_file_atomic
from preprocess import eval_overlap
from preprocess.reading import Chunk, ChunkReader

Keyed = tuple[bytes, bytes]  # (sha256 key, serialised record)
BucketId = tuple[str, int]  # (source role: "train" or "eval", bucket number)
FragmentRef = tuple[str, int]  # (file of one chunk's records of one bucket, record count)
Piece = tuple[str, int, int]  # (spilled bucket file, first record, end record)
CopyTask = tuple[str, str, int | None, list[Piece]]  # (path, split, worker, pieces)
MakePlan = Callable[[int], Any]  # number of examples -> plan.TrainPlan / plan.WholeSplitPlan
HoldOut = tuple[str, float]  # (role, share of a role's images that go to it by image digest)
FRAGMENTS_DIR = "_fragments"
BUCKETS_DIR = "_buckets"
MAX_BUCKET_BITS = 20
KEY_BYTES = 32  # a fragment record is key + record: sorting those sorts by (key, record)


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


def fragment_path(staging_dir: str, role: str, bucket: int, chunk: Chunk) -> str:
    """Where one chunk's records of one bucket wait to be sorted. The name depends only on
    the chunk and the bucket, so a retried read overwrites its fragments instead of adding some."""
    _, start, end = chunk
    return layout.join(
        staging_dir, FRAGMENTS_DIR, role, f"{bucket:07d}", f"{start:012d}-{end:012d}.tfrecord"
    )


def bucket_path(staging_dir: str, role: str, bucket: int) -> str:
    """Where a sorted bucket is spilled inside the staging folder."""
    return layout.join(staging_dir, BUCKETS_DIR, role, f"{bucket:07d}.tfrecord")


def write_records(path: str, records: Iterable[bytes]) -> None:
    """Writes records as one TFRecord file."""
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)


def read_records(path: str) -> list[bytes]:
    """The records of a TFRecord file (framing stripped; the file is read whole)."""
    with tf.io.gfile.GFile(path, "rb") as f:
        data = f.read()
    offsets = record_offsets(data)
    # A record is framed as length (8 bytes), its CRC (4), the data, the data's CRC (4).
    return [data[begin + 12 : end - 4] for begin, end in zip(offsets, offsets[1:], strict=False)]


class SpillFragments(beam.DoFn):
    """Reads one chunk, keys its records and writes them as one fragment file per bucket the
    chunk touches; emits (bucket id, (fragment path, count)) per fragment and nothing bigger.

    The chunk is held in memory while it is cut by bucket (its size is the read chunk size),
    then each fragment is written in turn through a temporary name. With `hold_out`, the records
    whose image digest falls in its share go to its role instead of `role`
    (`eval_overlap.is_held_out`).
    """

    def __init__(
        self,
        reader: ChunkReader,
        role: str,
        seed: str,
        bits: int,
        staging_dir: str,
        hold_out: HoldOut | None = None,
    ):
        self._reader = reader
        self._role = role
        self._seed = seed
        self._bits = bits
        self._staging_dir = staging_dir
        self._hold_out = hold_out

    def setup(self) -> None:
        self._reader.setup()

    def key(self, batch: list[bytes]) -> list[Keyed]:
        """The batch's records with their keys."""
        return key_records(batch, self._seed)

    def role_of(self, record: bytes) -> str:
        """The role a record goes to: the held-out one when its image falls in that share."""
        if self._hold_out is None:
            return self._role
        held_role, fraction = self._hold_out
        held = eval_overlap.is_held_out(eval_overlap.image_digest(record), fraction)
        return held_role if held else self._role

    def process(self, chunk: Chunk) -> Iterator[tuple[BucketId, FragmentRef]]:
        parts: dict[BucketId, list[bytes]] = collections.defaultdict(list)
        for batch in self._reader.read(chunk):
            for key, record in self.key(batch):
                parts[self.role_of(record), bucket_of(key, self._bits)].append(key + record)
        for role, bucket in sorted(parts):
            blobs = parts.pop((role, bucket))
            path = fragment_path(self._staging_dir, role, bucket, chunk)
            write_file_atomic(path, functools.partial(write_records, records=blobs))
            yield (role, bucket), (path, len(blobs))


def write_sorted(path: str, counts: dict[str, int]) -> None:
    """Writes the records of the fragments (path → record count) sorted by (key, record).

    Raises:
        ValueError: a fragment holds another number of records than its count.
    """
    blobs: list[bytes] = []
    for fragment, count in sorted(counts.items()):
        records = read_records(fragment)
        if len(records) != count:
            raise ValueError(f"{fragment} holds {len(records)} records, not {count}")
        blobs.extend(records)
    blobs.sort()
    write_records(path, (blob[KEY_BYTES:] for blob in blobs))


class SortBucket(beam.DoFn):
    """Reads one bucket's fragments, sorts its records by (key, record), spills them as
    TFRecords, removes the fragments and emits the bucket's size.

    Identical records share a key and land next to each other, each with its own rank. A retry
    after the bucket file was written (and some fragments removed) keeps that file: it was renamed
    into place whole, from every fragment of the bucket.
    """

    def __init__(self, staging_dir: str):
        self._staging_dir = staging_dir

    def process(self, element: tuple[BucketId, Iterable[FragmentRef]]) -> Iterator[dict[str, Any]]:
        (role, bucket), refs = element
        counts = dict(refs)  # a repeated element names the same file: it is read once
        path = bucket_path(self._staging_dir, role, bucket)
        if not tf.io.gfile.exists(path):
            write_file_atomic(path, functools.partial(write_sorted, counts=counts))
        for fragment in counts:
            if tf.io.gfile.exists(fragment):
                tf.io.gfile.remove(fragment)
        yield {"role": role, "bucket": bucket, "count": sum(counts.values()), "path": path}


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
    """Read chunks per source role → file entries of the shard files written for them.

    Args:
        roles: role ("train", "eval") → (plan maker: number of examples → plan, bucket bits);
            a role without chunks is filled by `hold_out`.
        seed: mixed into every key, so a different seed gives a different assignment.
        staging_dir: absolute folder the files are written into (fragments under `_fragments/`,
            buckets under `_buckets/`).
        reader: reads a chunk's records; it runs inside the step that spills them.
        hold_out: (role, share): that share of every read role's images, chosen by image
            digest, goes to that role.
    """

    def __init__(
        self,
        roles: dict[str, tuple[MakePlan, int]],
        seed: str,
        staging_dir: str,
        reader: ChunkReader,
        hold_out: HoldOut | None = None,
    ):
        super().__init__()
        self._roles = roles
        self._seed = seed
        self._staging_dir = staging_dir
        self._reader = reader
        self._hold_out = hold_out

    def expand(self, chunks: dict[str, beam.PCollection]) -> beam.PCollection:
        fragments = [
            chunks[role]
            | f"Read{role.title()}"
            >> beam.ParDo(
                SpillFragments(
                    self._reader, role, self._seed, bits, self._staging_dir, self._hold_out
                )
            )
            for role, (_, bits) in sorted(self._roles.items())
            if role in chunks
        ]
        make_plans = {role: make_plan for role, (make_plan, _) in self._roles.items()}
        return (
            fragments
            | "MergeFragments" >> beam.Flatten()
            | "GroupFragmentsByBucket" >> beam.GroupByKey()
            | "SortBuckets" >> beam.ParDo(SortBucket(self._staging_dir))
            | "GatherBucketSizes"
            >> beam.CombineGlobally(beam.combiners.ToListCombineFn()).without_defaults()
            | "PlanCopies" >> beam.FlatMap(plan_copies, make_plans=make_plans)
            | "DistributeCopies" >> beam.Reshuffle()
            | "WriteFiles" >> beam.ParDo(WriteFile(self._staging_dir))
        )
