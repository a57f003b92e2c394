"""TensorBoard scalar and histogram summaries from core TF ops (no tensorboard package needed).

The written events follow TensorBoard's v2 formats: a scalar tensor under the `scalars`
plugin, and a [buckets, 3] (left edge, right edge, count) tensor under `histograms`.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

HISTOGRAM_BUCKETS = 30


def _metadata(plugin: str, data_class: int) -> summary_pb2.SummaryMetadata:
    metadata = summary_pb2.SummaryMetadata(data_class=data_class)
    metadata.plugin_data.plugin_name = plugin
    return metadata


SCALAR_METADATA = _metadata("scalars", summary_pb2.DATA_CLASS_SCALAR)
HISTOGRAM_METADATA = _metadata("histograms", summary_pb2.DATA_CLASS_TENSOR)


def scalar(name: str, value: float | tf.Tensor, step: int | tf.Tensor | None = None) -> None:
    """Writes a scalar to the default writer."""
    tensor = tf.cast(value, tf.float32)
    tf.summary.write(name, tensor, step=step, metadata=SCALAR_METADATA)


def histogram_buckets(values: tf.Tensor, buckets: int = HISTOGRAM_BUCKETS) -> tf.Tensor:
    """Equal-width buckets over [min, max] of `values`: a float64 [buckets, 3] tensor."""
    flat = tf.cast(tf.reshape(values, [-1]), tf.float64)
    low = tf.reduce_min(flat)
    high = tf.reduce_max(flat)
    high = tf.where(high > low, high, low + 1.0)
    counts = tf.histogram_fixed_width(flat, tf.stack([low, high]), nbins=buckets)
    edges = tf.linspace(low, high, buckets + 1)
    return tf.stack([edges[:-1], edges[1:], tf.cast(counts, tf.float64)], axis=1)


def histogram(name: str, values: tf.Tensor, step: int | tf.Tensor | None = None) -> None:
    """Writes a histogram of `values` to the default writer."""
    tf.summary.write(name, histogram_buckets(values), step=step, metadata=HISTOGRAM_METADATA)
