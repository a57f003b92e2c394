"""Input pipelines: a worker's own train shards (repeated) and its disjoint slice of validation."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from contract import layout, manifest, records

AUTOTUNE = tf.data.AUTOTUNE
MAX_SHUFFLE_BUFFER = 65536


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


def train_dataset(
    data_dir: str,
    shard_manifest: dict[str, Any],
    worker: int,
    per_worker_batch_size: int,
    seed: int,
) -> tf.data.Dataset:
    """One worker's train files only, cached, shuffled with a seed, repeated, batched, parsed."""
    files = manifest.shard_paths_for_worker(data_dir, shard_manifest, worker)
    per_worker = shard_manifest["splits"][layout.TRAIN_SPLIT]["examples_per_worker"]
    dataset = (
        tf.data.TFRecordDataset(files)
        .cache()
        .shuffle(min(per_worker, MAX_SHUFFLE_BUFFER), seed=seed + worker)
        .repeat()
        .batch(per_worker_batch_size, drop_remainder=True)
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
