"""Reading a split in chunks: the ranges readers take, and the readers of one range.

A split is named in TFDS split syntax ('train', 'train[:90%]', 'train+extra'), resolved once
on the driver into ranges of the dataset's own splits; a chunk is a range of that
concatenation, and `SplitChunkReader` hands each piece to the dataset's range reader (TFDS,
image folder, TFRecord files).

A reader is a plain object, not a Beam step: the step that reads a chunk also writes its
records to disk (`transforms.SpillPieces`), so records never travel between Beam steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import tensorflow as tf

from contract import records

Chunk = tuple[str, int, int]  # (split, first example, end example)
SplitRange = tuple[str, int, int]  # (one of the dataset's own splits, first example, end)


class ChunkReader(Protocol):
    """Reads the records of a chunk, a batch (list of serialised records) at a time."""

    def setup(self) -> None: ...

    def read(self, chunk: Chunk) -> Iterator[list[bytes]]: ...


class RangeReader(Protocol):
    """Reads examples [start, end) of one of the dataset's own splits as encoded records."""

    def setup(self) -> None: ...

    def read_range(self, split: str, start: int, end: int) -> Iterator[list[bytes]]: ...


class SplitChunkReader:
    """Reads chunks of split expressions through a range reader.

    Args:
        reader: reads ranges of the dataset's own splits.
        ranges: split expression → the ranges of own splits it is, in order.
    """

    def __init__(self, reader: RangeReader, ranges: dict[str, list[SplitRange]]):
        self._reader = reader
        self._ranges = ranges

    def setup(self) -> None:
        self._reader.setup()

    def read(self, chunk: Chunk) -> Iterator[list[bytes]]:
        expression, start, end = chunk
        offset = 0
        for split, first, stop in self._ranges[expression]:
            size = stop - first
            begin, finish = max(start, offset), min(end, offset + size)
            if begin < finish:
                yield from self._reader.read_range(
                    split, first + begin - offset, first + finish - offset
                )
            offset += size


def read_chunks(split: str, num_examples: int, chunk_size: int) -> list[Chunk]:
    """Cuts a TFDS split into (split, start, end) ranges that readers take in parallel."""
    return [
        (split, s, min(s + chunk_size, num_examples)) for s in range(0, num_examples, chunk_size)
    ]


class TfdsRangeReader:
    """Reads one range of a prepared TFDS split as batches of encoded records.

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

    def read_range(self, split: str, start: int, end: int) -> Iterator[list[bytes]]:
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
