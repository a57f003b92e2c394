"""Input pipelines: a worker's train shards in a seeded order per epoch; its validation slice."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from contract import layout, manifest, records
from train.config import TrainConfig

# Fixed parallelism and prefetch depth instead of tf.data's autotuning: an autotuned
# iterator's optimisation thread sleeps up to a minute between rounds, and deleting the
# iterator waits for it, so `fit` took 31-97 s to return after the last epoch of a full run
# (52 s after 150 s of iteration in a bare repro; 0.3 s with autotune off).
PARALLEL_CALLS = 2
PREFETCH_BATCHES = 2
AUGMENT_SHIFT = 2  # pixels, each way
# The input functions here are straight-line TensorFlow ops that call no user code, so they
# are traced as written (`do_not_convert`): autograph's source conversion, which tf.data
# applies to every function it traces, would change nothing in them and cost every worker
# about a second of a slow CPU at each start.
do_not_convert = tf.autograph.experimental.do_not_convert
_AUGMENT_STREAM = 1 << 30  # folded into an epoch's key for its augmentation keys
DEFAULT_MEMORY_BUDGET_MB = TrainConfig.input_memory_budget_mb


def _untuned_options() -> tf.data.Options:
    """Options without tf.data's autotuning (see PARALLEL_CALLS)."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def _worker_options(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """No autotuning, and no auto-sharding: each worker already reads only its own files, so
    tf.distribute must not shard again."""
    options = _untuned_options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)


def untune_device_datasets() -> None:
    """Turns autotuning off in the per-device datasets tf.distribute puts after a worker's own.

    Under MultiWorkerMirroredStrategy `fit` reads a worker's dataset through a
    MultiDeviceIterator, whose per-device datasets are new pipelines with default options, so
    each starts the autotune thread that `_worker_options` keeps out of ours; deleting the
    iterator when `fit` returns then waited for it (20-52 s after full-length runs). Only
    options change, never which elements come in which order. Safe to call more than once.
    """
    from tensorflow.python.data.ops import multi_device_iterator_ops as ops

    create = ops._create_device_dataset
    if hasattr(create, "original"):  # already replaced
        return
    options = _untuned_options()

    def create_untuned(*args: Any, **kwargs: Any) -> tf.data.Dataset:
        return create(*args, **kwargs).with_options(options)

    create_untuned.original = create  # type: ignore[attr-defined]
    ops._create_device_dataset = create_untuned


def _parse(image_shape: list[int]):
    @do_not_convert
    def parse(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        images, labels = records.parse_batch(serialized, image_shape)
        return tf.cast(images, tf.float32), labels

    return parse


def epoch_key(seed: int, worker: int, epoch: int | tf.Tensor) -> tf.Tensor:
    """The stateless random key of one worker's epoch: a function of (seed, worker, epoch)."""
    return tf.random.experimental.stateless_fold_in(
        tf.constant([seed, worker], tf.int64), tf.cast(epoch, tf.int64)
    )


def epoch_order(num_examples: int, seed: int, worker: int, epoch: int | tf.Tensor) -> tf.Tensor:
    """The order a worker reads its examples in during `epoch`: a stateless permutation.

    A function of (seed, worker, epoch) only, so a resumed run reads exactly what an
    uninterrupted one would, and each worker and epoch gets its own order.
    """
    key = epoch_key(seed, worker, epoch)
    return tf.random.experimental.stateless_shuffle(tf.range(num_examples, dtype=tf.int64), key)


@dataclasses.dataclass(frozen=True)
class InputPlan:
    """How a worker reads its train files: all in memory, or streamed in shuffled windows."""

    in_memory: bool
    window: int  # examples shuffled together when streaming

    def describe(self) -> str:
        return "memory" if self.in_memory else f"stream-window-{self.window}"


def input_plan(
    shard_manifest: dict[str, Any], worker: int, per_worker_batch_size: int, budget_mb: int
) -> InputPlan:
    """Memory when the worker's files (their manifest `size_bytes`) fit `budget_mb`, else a
    stream whose shuffle window holds about half of `budget_mb` of records (at least one
    batch): shuffling holds a window twice."""
    entries = manifest.file_entries(shard_manifest, layout.TRAIN_SPLIT, worker)
    size = sum(int(entry["size_bytes"]) for entry in entries)
    count = max(1, sum(int(entry["num_examples"]) for entry in entries))
    budget = budget_mb * (1 << 20)
    if size <= budget:
        return InputPlan(in_memory=True, window=count)
    # A window is held twice while it is shuffled (the records and their permutation).
    window = max(per_worker_batch_size, min(count, budget // 2 // max(1, size // count)))
    return InputPlan(in_memory=False, window=window)


def input_description(
    shard_manifest: dict[str, Any], num_workers: int, per_worker_batch_size: int, budget_mb: int
) -> str:
    """Every worker's input plan in one string: what a resume must read the same way."""
    return ",".join(
        input_plan(shard_manifest, w, per_worker_batch_size, budget_mb).describe()
        for w in range(num_workers)
    )


def read_worker_records(data_dir: str, shard_manifest: dict[str, Any], worker: int) -> tf.Tensor:
    """All of a worker's serialized train examples, in file order, as one string tensor."""
    files = manifest.shard_paths_for_worker(data_dir, shard_manifest, worker)
    chunks = list(tf.data.TFRecordDataset(files).batch(8192))
    return tf.concat(chunks, axis=0) if chunks else tf.constant([], tf.string)


def _in_memory_batches(
    records: tf.Tensor, seed: int, worker: int, steps: int, batch_size: int
) -> Callable[[tf.Tensor], tf.data.Dataset]:
    num_examples = int(records.shape[0])

    @do_not_convert
    def epoch_batches(epoch: tf.Tensor) -> tf.data.Dataset:
        order = epoch_order(num_examples, seed, worker, epoch)[: steps * batch_size]
        indices = tf.data.Dataset.from_tensor_slices(tf.reshape(order, [steps, batch_size]))
        return indices.map(do_not_convert(lambda batch: tf.gather(records, batch)))

    return epoch_batches


def _streamed_batches(
    files: list[str], seed: int, worker: int, steps: int, batch_size: int, window: int
) -> Callable[[tf.Tensor], tf.data.Dataset]:
    paths = tf.constant(files)

    @do_not_convert
    def epoch_batches(epoch: tf.Tensor) -> tf.data.Dataset:
        key = epoch_key(seed, worker, epoch)
        file_order = tf.random.experimental.stateless_shuffle(tf.range(len(files)), key)
        cycle_length = min(len(files), 4)
        records = tf.data.Dataset.from_tensor_slices(tf.gather(paths, file_order)).interleave(
            tf.data.TFRecordDataset,
            cycle_length=cycle_length,
            num_parallel_calls=min(cycle_length, PARALLEL_CALLS),  # tf.data's rule
            deterministic=True,
        )

        @do_not_convert
        def shuffle_window(index: tf.Tensor, chunk: tf.Tensor) -> tf.data.Dataset:
            window_key = tf.random.experimental.stateless_fold_in(key, index)
            order = tf.random.experimental.stateless_shuffle(
                tf.range(tf.shape(chunk)[0]), window_key
            )
            return tf.data.Dataset.from_tensor_slices(tf.gather(chunk, order))

        shuffled = records.batch(window).enumerate().flat_map(shuffle_window)
        return shuffled.take(steps * batch_size).batch(batch_size, drop_remainder=True)

    return epoch_batches


def train_dataset(
    data_dir: str,
    shard_manifest: dict[str, Any],
    worker: int,
    per_worker_batch_size: int,
    seed: int,
    start_epoch: int = 0,
    start_step: int = 0,
    memory_budget_mb: int = DEFAULT_MEMORY_BUDGET_MB,
    augment: str = "off",
) -> tf.data.Dataset:
    """One worker's train examples from (start_epoch, start_step) on, endlessly, parsed.

    Each epoch is `steps_per_epoch` batches in an order that depends on (seed, worker, epoch)
    only. When the worker's files fit `memory_budget_mb` they are read once into memory and
    epoch e is the permutation `epoch_order(seed, worker, e)`; otherwise they are streamed
    every epoch, in a stateless file order, interleaved, and shuffled in windows of about
    the budget. Either way each epoch leaves out a different remainder of
    `examples % batch`, and a resume at (epoch, step) skips that epoch's first `step`
    batches, so it feeds exactly the batches an uninterrupted run would.

    `augment="flip-shift"` flips and shifts each image of a batch at random, with a key that
    is a function of (seed, worker, epoch, batch index): resumed runs augment alike too.
    """
    steps = manifest.steps_per_epoch(shard_manifest, per_worker_batch_size)
    plan = input_plan(shard_manifest, worker, per_worker_batch_size, memory_budget_mb)
    if plan.in_memory:
        records = read_worker_records(data_dir, shard_manifest, worker)
        if int(records.shape[0]) < steps * per_worker_batch_size:
            raise manifest.ManifestError(
                f"worker {worker}'s train files hold {int(records.shape[0])} examples, fewer "
                f"than its {steps} steps of {per_worker_batch_size} need: rerun preprocess"
            )
        epoch_batches = _in_memory_batches(records, seed, worker, steps, per_worker_batch_size)
    else:
        files = manifest.shard_paths_for_worker(data_dir, shard_manifest, worker)
        epoch_batches = _streamed_batches(
            files, seed, worker, steps, per_worker_batch_size, plan.window
        )
    parse = _parse(shard_manifest["image_shape"])
    batches_of_epoch: Callable[[tf.Tensor], tf.data.Dataset] = epoch_batches
    to_examples: Callable[..., tuple[tf.Tensor, tf.Tensor]] = parse
    if augment != "off":

        @do_not_convert
        def batches_of_epoch(epoch: tf.Tensor) -> tf.data.Dataset:
            # Each batch with its augmentation key: a function of (seed, worker, epoch, index).
            stream = tf.random.experimental.stateless_fold_in(
                epoch_key(seed, worker, epoch), _AUGMENT_STREAM
            )
            return (
                epoch_batches(epoch)
                .enumerate()
                .map(
                    do_not_convert(
                        lambda i, b: (b, tf.random.experimental.stateless_fold_in(stream, i))
                    )
                )
            )

        @do_not_convert
        def to_examples(batch: tf.Tensor, key: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            images, labels = parse(batch)
            return flip_shift(images, key, AUGMENT_SHIFT), labels

    dataset = (
        tf.data.Dataset.counter(start_epoch)
        .flat_map(batches_of_epoch)
        .skip(start_step)
        .map(to_examples, num_parallel_calls=PARALLEL_CALLS)
        # Endless, and now declared so: a dataset of unknown length makes every step of a
        # multi-worker fit all-reduce whether any worker still has data (tf.distribute's
        # get_next_as_optional), one more collective in each step besides the gradients'.
        .apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
    )
    return _worker_options(dataset.prefetch(PREFETCH_BATCHES))


def flip_shift(images: tf.Tensor, key: tf.Tensor, max_shift: int) -> tf.Tensor:
    """Each image of a [N, H, W, C] batch flipped left-right with probability 1/2 and shifted
    by whole pixels in [-max_shift, max_shift] each way (zeros fill in), all drawn from `key`."""
    keys = tf.random.experimental.stateless_split(key, 2)
    images = tf.image.stateless_random_flip_left_right(images, keys[0])
    n = tf.shape(images)[0]
    shifts = tf.cast(
        tf.random.stateless_uniform(
            [n, 2], keys[1], minval=-max_shift, maxval=max_shift + 1, dtype=tf.int32
        ),
        tf.float32,
    )
    ones, zeros = tf.ones([n, 1]), tf.zeros([n, 1])
    # Output pixel (x, y) takes input pixel (x + dx, y + dy).
    transforms = tf.concat(
        [ones, zeros, shifts[:, :1], zeros, ones, shifts[:, 1:], zeros, zeros], axis=1
    )
    return tf.raw_ops.ImageProjectiveTransformV3(
        images=images,
        transforms=transforms,
        output_shape=tf.shape(images)[1:3],
        fill_value=0.0,
        interpolation="NEAREST",
        fill_mode="CONSTANT",
    )


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
        .map(_parse(shard_manifest["image_shape"]), num_parallel_calls=PARALLEL_CALLS)
        .cache()
        .prefetch(PREFETCH_BATCHES)
    )
    return _worker_options(dataset)
