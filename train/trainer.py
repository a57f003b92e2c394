"""The training wrapper: all-reduces gradients explicitly so the chief can histogram them."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras as keras
from tensorboard.plugins.histogram import metadata as histogram_metadata

# TensorBoard's default: tf.summary.histogram's bucket count.
HISTOGRAM_BUCKETS = 30


def histogram_buckets(values: np.ndarray, bucket_count: int = HISTOGRAM_BUCKETS) -> np.ndarray:
    """[bucket_count, (left edge, right edge, count)] of `values`, as tf.summary.histogram
    buckets them: equal widths from the least value to the greatest, the greatest counted in
    the last bucket; all in the last when every value is the same; zeros when there is none."""
    data = np.asarray(values, dtype=np.float64).ravel()
    if data.size == 0:
        return np.zeros((bucket_count, 3))
    low, high = data.min(), data.max()
    if low == high:
        last = np.zeros(bucket_count)
        last[-1] = data.size
        return np.stack([np.full(bucket_count, low), np.full(bucket_count, low), last], axis=1)
    indices = np.floor((data - low) / ((high - low) / bucket_count)).astype(np.int64)
    counts = np.bincount(np.minimum(indices, bucket_count - 1), minlength=bucket_count)
    edges = np.linspace(low, high, bucket_count + 1)
    return np.stack([edges[:-1], edges[1:], counts.astype(np.float64)], axis=1)


# What marks a summary value as a histogram for TensorBoard, as TensorFlow's own proto.
_HISTOGRAM_METADATA = tf.compat.v1.SummaryMetadata.FromString(
    histogram_metadata.create_summary_metadata(None, None).SerializeToString()
)


def histogram_summary(named_values: dict[str, np.ndarray]) -> bytes:
    """One serialized Summary holding a TensorBoard histogram of each named array."""
    summary = tf.compat.v1.Summary()
    for name, values in named_values.items():
        summary.value.add(
            tag=name,
            metadata=_HISTOGRAM_METADATA,
            tensor=tf.make_tensor_proto(histogram_buckets(values), dtype=tf.float64),
        )
    return summary.SerializeToString()


def all_reduce_flat(
    grads: list[tf.Tensor],
    variables: list[tf.Variable],
    options: tf.distribute.experimental.CommunicationOptions,
) -> list[tf.Tensor]:
    """Sums gradients across workers in ONE collective over their concatenation.

    Shapes come from the variables: a gradient's static shape can be unknown (pooling's
    gradient through a reshape loses it), a variable's never is.

    One timed collective per tensor would park one timer thread each for the timeout's
    length (see `cluster.make_strategy`); one over the concatenation parks one.
    """
    flat = tf.concat([tf.reshape(g, [-1]) for g in grads], axis=0)
    total = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, flat, options=options
    )
    pieces = tf.split(total, [v.shape.num_elements() for v in variables])
    return [tf.reshape(p, v.shape) for p, v in zip(pieces, variables, strict=True)]


class Trainer(keras.Model):
    """Wraps the exported model; its train_step sums gradients across workers itself.

    The compiled loss is already divided by the number of replicas, so the SUM of the
    per-replica gradients is the gradient of the global mean loss, as Keras would apply.
    """

    def __init__(
        self,
        core: keras.Model,
        histogram_freq_steps: int,
        collective_options: tf.distribute.experimental.CommunicationOptions,
        autograph: bool = True,
    ) -> None:
        """`autograph=False` traces the train step as written, without autograph's source
        conversion: for a step of built-in layers, loss and optimizer only (the conversion
        changes nothing there and costs each worker CPU at every start). User code by import
        path may branch on tensors, which only autograph turns into graph ops."""
        # No autocast: the images go to `core` as they come, whatever the dtype policy.
        super().__init__(name="trainer", autocast=False)
        self.core = core
        self.collective_options = collective_options
        self.histogram_freq_steps = histogram_freq_steps
        self.summary_writer: tf.summary.SummaryWriter | None = None
        # (epoch, step) fit starts at: the backup's position, restored before fit.
        self.start_position = (0, 0)
        self.autograph = autograph
        self._traced_as_written: Any = None

    def make_train_function(self, force: bool = False) -> Any:
        function = super().make_train_function(force)
        python_function = getattr(function, "python_function", None)  # None: run eagerly
        if self.autograph or python_function is None or function is self._traced_as_written:
            return function
        # Keras's own tf.function of its train function, as Keras makes it but for autograph.
        self._traced_as_written = tf.function(
            python_function, reduce_retracing=True, autograph=False
        )
        self.train_function = self._traced_as_written
        return self.train_function

    def _maybe_load_initial_counters_from_ckpt(
        self, steps_per_epoch: int, initial_epoch: int
    ) -> tuple[int, int]:
        # Keras asks this where fit starts; its own answer needs BackupAndRestore, whose
        # backup lacks the state an exact resume needs (train.backup has it instead).
        return self.start_position

    def call(self, inputs: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        return self.core(inputs, training=training)

    def train_step(self, data: tuple[tf.Tensor, tf.Tensor]) -> dict[str, tf.Tensor]:
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x, y, y_pred)
        variables = self.trainable_variables
        grads = all_reduce_flat(tape.gradient(loss, variables), variables, self.collective_options)
        self._write_histograms(grads, variables)
        self.optimizer.apply_gradients(
            zip(grads, variables, strict=True), skip_gradients_aggregation=True
        )
        # Only each worker's running sums: Keras's compute_metrics would also read every
        # metric across workers and sum the step's outputs, six collectives a step for logs
        # nobody reads per step. callbacks.TrainMetrics reads them when they are used.
        self.compiled_metrics.update_state(y, y_pred)
        return {}

    def _write_histograms(self, grads: list[tf.Tensor], variables: list[tf.Variable]) -> None:
        """On due steps, hands the step's gradients to Python, which writes their histograms.

        `tf.summary.histogram` traced into the step for every variable made the first step
        several seconds slower (its bucketing ops, under a cond, in the collective step
        function), every run, on every worker. From a py_function it costs nothing to trace;
        its buckets are counted in NumPy and written as one summary (eager bucketing ops would
        take about 30 ms a write for the `mlp`'s six variables).
        """
        if self.histogram_freq_steps <= 0 or self.summary_writer is None:
            return
        step = self.optimizer.iterations
        names = [f"gradients/{variable.name.split(':')[0]}" for variable in variables]
        writer = self.summary_writer

        def write(step_value: tf.Tensor, *values: tf.Tensor) -> None:
            summary = histogram_summary(
                {name: value.numpy() for name, value in zip(names, values, strict=True)}
            )
            with writer.as_default():
                tf.summary.experimental.write_raw_pb(summary, step=int(step_value))

        def write_now() -> tf.Tensor:
            tf.py_function(write, [step, *grads], Tout=[])
            return tf.constant(True)

        tf.cond(
            tf.equal(step % self.histogram_freq_steps, 0), write_now, lambda: tf.constant(False)
        )
