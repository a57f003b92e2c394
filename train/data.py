"""Input pipelines: a worker's train shards in a seeded order per epoch; its validation slice."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from contract import layout, manifest, records

AUTOTUNE = tf.data.AUTOTUNE


def _no_auto_shard(dataset: tf.data.Dataset) -> tf.data.Dataset:
    # Each worker already reads only its own files; tf.distribute must not shard again.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)


def _parse(image_shape: list[int]):
    def parse(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        images, labels = records.parse_batch(serialized, image_shape)
        return tf.cast(images, tf.float32), labels

    return parse


def steps_per_epoch(shard_manifest: dict[str, Any], per_worker_batch_size: int) -> int:
    """Steps every worker runs per epoch: the same on all workers, from the manifest."""
    per_worker = shard_manifest["splits"][layout.TRAIN_SPLIT]["examples_per_worker"]
    return per_worker // per_worker_batch_size


def epoch_order(num_examples: int, seed: int, worker: int, epoch: int | tf.Tensor) -> tf.Tensor:
    """The order a worker reads its examples in during `epoch`: a stateless permutation.

    A function of (seed, worker, epoch) only, so a resumed run reads exactly what an
    uninterrupted one would, and each worker and epoch gets its own order.
    """
    key = tf.random.experimental.stateless_fold_in(
        tf.constant([seed, worker], tf.int64), tf.cast(epoch, tf.int64)
    )
    return tf.random.experimental.stateless_shuffle(tf.range(num_examples, dtype=tf.int64), key)


def read_worker_records(data_dir: str, shard_manifest: dict[str, Any], worker: int) -> tf.Tensor:
    """All of a worker's serialized train examples, in file order, as one string tensor."""
    files = manifest.shard_paths_for_worker(data_dir, shard_manifest, worker)
    chunks = list(tf.data.TFRecordDataset(files).batch(8192))
    return tf.concat(chunks, axis=0) if chunks else tf.constant([], tf.string)


def train_dataset(
    data_dir: str,
    shard_manifest: dict[str, Any],
    worker: int,
    per_worker_batch_size: int,
    seed: int,
    start_epoch: int = 0,
    start_step: int = 0,
) -> tf.data.Dataset:
    """One worker's train examples from (start_epoch, start_step) on, endlessly, parsed.

    The worker's files are read once into memory. Epoch e is `epoch_order(seed, worker, e)`
    cut into `steps_per_epoch` batches (the remainder of a permutation is left out, a
    different one each epoch); a resume at (epoch, step) skips that epoch's first `step`
    batches without reading them, so it feeds exactly the batches an uninterrupted run would.
    """
    records = read_worker_records(data_dir, shard_manifest, worker)
    num_examples = int(records.shape[0])
    steps = steps_per_epoch(shard_manifest, per_worker_batch_size)
    used = steps * per_worker_batch_size
    if num_examples < used:
        raise manifest.ManifestError(
            f"worker {worker}'s train files hold {num_examples} examples but the manifest "
            f"promises {shard_manifest['splits'][layout.TRAIN_SPLIT]['examples_per_worker']}: "
            "rerun preprocess"
        )

    def epoch_batches(epoch: tf.Tensor) -> tf.data.Dataset:
        order = epoch_order(num_examples, seed, worker, epoch)[:used]
        return tf.data.Dataset.from_tensor_slices(tf.reshape(order, [steps, per_worker_batch_size]))

    dataset = (
        tf.data.Dataset.counter(start_epoch)
        .flat_map(epoch_batches)
        .skip(start_step)
        .map(lambda indices: tf.gather(records, indices))
        .map(_parse(shard_manifest["image_shape"]), num_parallel_calls=AUTOTUNE)
        .prefetch(AUTOTUNE)
    )
    return _no_auto_shard(dataset)


def validation_dataset(
    data_dir: str,
    shard_manifest: dict[str, Any],
    worker: int,
    num_workers: int,
    batch_size: int,
) -> tf.data.Dataset:
    """A worker's disjoint slice of the whole validation split: finite, read once per pass."""
    files = manifest.split_paths(data_dir, shard_manifest, layout.VALIDATION_SPLIT)
    dataset = (
        tf.data.TFRecordDataset(files)
        .shard(num_workers, worker)
        .batch(batch_size)
        .map(_parse(shard_manifest["image_shape"]), num_parallel_calls=AUTOTUNE)
        .cache()
        .prefetch(AUTOTUNE)
    )
    return _no_auto_shard(dataset)
