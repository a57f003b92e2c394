"""The Beam steps of the stage: read TFDS in chunks, key records, rank them, write shard files.

Elements are batches (lists) of records, not single records, to keep Beam's per-element
overhead off the hot path.
"""

from __future__ import annotations

import bisect
import collections
import hashlib
import itertools
import posixpath
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import apache_beam as beam
import tensorflow as tf

from contract import atomic, layout, records
from preprocess.plan import FileSlot

Keyed = tuple[bytes, bytes]  # (sha256 key, serialised record)
ShardPart = tuple[str, tuple[str, int | None, list[Keyed]]]  # (path, (split, worker, records))
DUPLICATES = "duplicates"


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


class _ConcatKeys(beam.CombineFn):
    """Gathers every batch's keys into one list (keys are small: 32 bytes per example)."""

    def create_accumulator(self) -> list[bytes]:
        return []

    def add_input(self, acc: list[bytes], batch: list[Keyed]) -> list[bytes]:
        acc.extend(k for k, _ in batch)
        return acc

    def merge_accumulators(self, accumulators: Iterable[list[bytes]]) -> list[bytes]:
        return list(itertools.chain.from_iterable(accumulators))

    def extract_output(self, acc: list[bytes]) -> list[bytes]:
        return sorted(acc)


class AssignFiles(beam.DoFn):
    """Ranks each record among all keys and groups a batch's records by their output file.

    Records whose key occurs more than once (byte-identical examples) go to the `duplicates`
    output: their ranks are handed out after grouping them, so each gets its own rank.
    """

    def __init__(self, make_plan: Callable[[int], Any]):
        self._make_plan = make_plan
        self._plan: Any = None

    def process(self, batch: list[Keyed], sorted_keys: list[bytes]) -> Iterator[Any]:
        if self._plan is None or self._plan.num_examples != len(sorted_keys):
            self._plan = self._make_plan(len(sorted_keys))
        plan = self._plan
        parts: dict[FileSlot, list[Keyed]] = collections.defaultdict(list)
        for key, record in batch:
            rank = bisect.bisect_left(sorted_keys, key)
            if rank + 1 < len(sorted_keys) and sorted_keys[rank + 1] == key:
                yield beam.pvalue.TaggedOutput(DUPLICATES, (key, record))
                continue
            parts[plan.slot(rank)].append((key, record))
        for slot, keyed in parts.items():
            yield slot.path, (slot.split, slot.worker, keyed)


class AssignDuplicates(beam.DoFn):
    """Gives each copy of a repeated record one of the ranks its key occupies."""

    def __init__(self, make_plan: Callable[[int], Any]):
        self._make_plan = make_plan

    def process(
        self, element: tuple[bytes, Iterable[bytes]], sorted_keys: list[bytes]
    ) -> Iterator[ShardPart]:
        key, copies = element
        plan = self._make_plan(len(sorted_keys))
        first = bisect.bisect_left(sorted_keys, key)
        for offset, record in enumerate(copies):
            slot = plan.slot(first + offset)
            yield slot.path, (slot.split, slot.worker, [(key, record)])


class WriteShard(beam.DoFn):
    """Writes one output file's records in key order; emits its manifest file entry."""

    def __init__(self, staging_dir: str):
        self._staging_dir = staging_dir

    def process(
        self, element: tuple[str, Iterable[tuple[str, int | None, list[Keyed]]]]
    ) -> Iterator[dict[str, Any]]:
        path, parts = element
        parts = list(parts)
        keyed = sorted(itertools.chain.from_iterable(p[2] for p in parts))
        split, worker = parts[0][0], parts[0][1]
        full_path = layout.join(self._staging_dir, path)
        tf.io.gfile.makedirs(posixpath.dirname(full_path))
        with tf.io.TFRecordWriter(full_path) as writer:
            for _, record in keyed:
                writer.write(record)
        yield {
            "path": path,
            "split": split,
            "worker": worker,
            "num_examples": len(keyed),
            "sha256": atomic.sha256_file(full_path),
            "size_bytes": tf.io.gfile.stat(full_path).length,
        }


class ShardSplit(beam.PTransform):
    """Batches of records of one split → file entries of the shard files written for it.

    Args:
        make_plan: builds the split's plan (rank → file) from the number of records.
        seed: mixed into every key, so a different seed gives a different assignment.
        staging_dir: folder the files are written into.
    """

    def __init__(self, make_plan: Callable[[int], Any], seed: str, staging_dir: str):
        super().__init__()
        self._make_plan = make_plan
        self._seed = seed
        self._staging_dir = staging_dir

    def expand(self, batches: beam.PCollection) -> beam.PCollection:
        keyed = batches | "KeyRecords" >> beam.Map(key_records, seed=self._seed)
        sorted_keys = beam.pvalue.AsSingleton(
            keyed | "GatherSortedKeys" >> beam.CombineGlobally(_ConcatKeys())
        )
        assigned = keyed | "AssignFiles" >> beam.ParDo(
            AssignFiles(self._make_plan), sorted_keys
        ).with_outputs(DUPLICATES, main="unique")
        repeated = (
            assigned[DUPLICATES]
            | "GroupCopies" >> beam.GroupByKey()
            | "AssignDuplicates" >> beam.ParDo(AssignDuplicates(self._make_plan), sorted_keys)
        )
        return (
            (assigned.unique, repeated)
            | "MergeAssigned" >> beam.Flatten()
            | "GroupByFile" >> beam.GroupByKey()
            | "WriteShard" >> beam.ParDo(WriteShard(self._staging_dir))
        )
