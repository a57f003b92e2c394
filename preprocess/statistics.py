"""Statistics of a shard set, in tensorflow-metadata's DatasetFeatureStatisticsList format.

The Beam job counts each written shard file once (`file_counts`, a step after the files are
written): examples, pixel sum and sum of squares, a histogram of pixel values, label counts.
These are whole numbers, so the merge does not depend on the order files are counted in. The
merged counts become one `DatasetFeatureStatistics` per part of the data (`train`: the train
and validation splits, what training reads; `eval`: the eval split), with an `image` feature
(every pixel value: count, mean, standard deviation, min, max, zeros, a histogram) and a `label`
feature (mean, standard deviation, min, max and a histogram with one bucket per class). Facets
and TFDV read the file as it is.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from tensorflow_metadata.proto.v0 import statistics_pb2

from contract import gfile, layout

STATISTICS_KEY = "statistics"  # the per-file counts in a file entry, removed before the manifest
PARTS = {
    "train": (layout.TRAIN_SPLIT, layout.VALIDATION_SPLIT),
    "eval": (layout.EVAL_SPLIT,),
}
# contract.records' feature names (a test holds them equal): that module loads TensorFlow,
# which the data gate's checks of these statistics do without.
IMAGE_FEATURE, LABEL_FEATURE = "image", "label"
PIXEL_VALUES = 256
PIXEL_BUCKETS = 16  # histogram buckets of the pixel values, 16 values each
READ_BATCH = 4096


def file_counts(
    entry: dict[str, Any], staging_dir: str, image_shape: list[int], num_classes: int
) -> dict[str, Any]:
    """A written file's entry with its counts (under `statistics`) added.

    Args:
        entry: the file's entry (its `path` relative to `staging_dir`).
        staging_dir: the folder the file was written in.
        image_shape: [H, W, C] of every image.
        num_classes: how many classes the labels index.
    """
    import tensorflow as tf  # only counting files needs it; the data gate's checks do not

    from contract import records

    pixels = np.zeros(PIXEL_VALUES, np.int64)
    labels = np.zeros(num_classes, np.int64)
    total = squares = 0
    dataset = (
        tf.data.TFRecordDataset(layout.join(staging_dir, entry["path"]))
        .batch(READ_BATCH)
        .map(
            tf.autograph.experimental.do_not_convert(lambda s: records.parse_batch(s, image_shape))
        )
    )
    for images, batch_labels in dataset.as_numpy_iterator():
        values = images.reshape(-1).astype(np.int64)
        pixels += np.bincount(values, minlength=PIXEL_VALUES)
        total += int(values.sum())
        squares += int((values * values).sum())
        labels += np.bincount(batch_labels, minlength=num_classes)[:num_classes]
    counts = {
        "examples": int(labels.sum()),
        "pixel_sum": total,
        "pixel_square_sum": squares,
        "pixel_histogram": pixels.tolist(),
        "label_counts": labels.tolist(),
    }
    return {**entry, STATISTICS_KEY: counts}


def merge(entries: list[dict[str, Any]], splits: tuple[str, ...]) -> dict[str, Any]:
    """The summed counts of the entries of `splits`."""
    chosen = [e[STATISTICS_KEY] for e in entries if e["split"] in splits]
    width = max((len(c["label_counts"]) for c in chosen), default=0)
    merged: dict[str, Any] = {
        "examples": sum(c["examples"] for c in chosen),
        "pixel_sum": sum(c["pixel_sum"] for c in chosen),
        "pixel_square_sum": sum(c["pixel_square_sum"] for c in chosen),
        "pixel_histogram": np.zeros(PIXEL_VALUES, np.int64),
        "label_counts": np.zeros(width, np.int64),
    }
    for c in chosen:
        merged["pixel_histogram"] += np.asarray(c["pixel_histogram"], np.int64)
        merged["label_counts"] += np.asarray(c["label_counts"], np.int64)
    return merged


def _moments(count: int, total: int, squares: int) -> tuple[float, float]:
    """Mean and (population) standard deviation from a count, a sum and a sum of squares."""
    if count == 0:
        return 0.0, 0.0
    mean = total / count
    return mean, math.sqrt(max(0.0, squares / count - mean * mean))


def _median(histogram: np.ndarray) -> float:
    cumulative = np.cumsum(histogram)
    return float(np.searchsorted(cumulative, cumulative[-1] / 2)) if cumulative[-1] else 0.0


def _feature(
    dataset: statistics_pb2.DatasetFeatureStatistics, name: str, values_per_example: int
) -> statistics_pb2.NumericStatistics:
    feature = dataset.features.add()
    feature.path.step.append(name)
    feature.type = statistics_pb2.FeatureNameStatistics.INT
    common = feature.num_stats.common_stats
    common.num_non_missing = dataset.num_examples
    common.num_missing = 0
    common.min_num_values = common.max_num_values = values_per_example
    common.avg_num_values = float(values_per_example)
    common.tot_num_values = dataset.num_examples * values_per_example
    return feature.num_stats


def _fill(stats: statistics_pb2.NumericStatistics, histogram: np.ndarray, width: int) -> None:
    """Mean, standard deviation, min, max, zeros, median and a histogram of integer values
    0, 1, ... counted in `histogram`, in buckets of `width` values."""
    values = np.arange(len(histogram), dtype=np.int64)
    count = int(histogram.sum())
    mean, std = _moments(
        count, int((values * histogram).sum()), int((values * values * histogram).sum())
    )
    stats.mean, stats.std_dev = mean, std
    present = np.flatnonzero(histogram)
    stats.min = float(present[0]) if len(present) else 0.0
    stats.max = float(present[-1]) if len(present) else 0.0
    stats.num_zeros = int(histogram[0]) if len(histogram) else 0
    stats.median = _median(histogram) if len(histogram) else 0.0
    chart = stats.histograms.add(type=statistics_pb2.Histogram.STANDARD)
    for low in range(0, len(histogram), width):
        bucket = chart.buckets.add()
        bucket.low_value, bucket.high_value = float(low), float(min(low + width, len(histogram)))
        bucket.sample_count = float(histogram[low : low + width].sum())


def to_proto(
    parts: dict[str, dict[str, Any]], image_shape: list[int]
) -> statistics_pb2.DatasetFeatureStatisticsList:
    """The statistics list of merged counts by part name (`train`, `eval`)."""
    out = statistics_pb2.DatasetFeatureStatisticsList()
    pixels_per_image = int(np.prod(image_shape))
    for name, counts in parts.items():
        dataset = out.datasets.add(name=name, num_examples=counts["examples"])
        image = _feature(dataset, IMAGE_FEATURE, pixels_per_image)
        _fill(image, np.asarray(counts["pixel_histogram"]), PIXEL_VALUES // PIXEL_BUCKETS)
        # The pixel moments from the exact sums (the histogram gives the same numbers).
        image.mean, image.std_dev = _moments(
            counts["examples"] * pixels_per_image,
            counts["pixel_sum"],
            counts["pixel_square_sum"],
        )
        _fill(_feature(dataset, LABEL_FEATURE, 1), np.asarray(counts["label_counts"]), 1)
    return out


def from_counts(
    entries: list[dict[str, Any]], image_shape: list[int]
) -> statistics_pb2.DatasetFeatureStatisticsList:
    """The statistics list of counted file entries (`file_counts`), one dataset per part."""
    return to_proto({name: merge(entries, splits) for name, splits in PARTS.items()}, image_shape)


def build(entries: list[dict[str, Any]], image_shape: list[int]) -> bytes:
    """The serialised statistics list of counted file entries."""
    return from_counts(entries, image_shape).SerializeToString(deterministic=True)


def read(path: str) -> statistics_pb2.DatasetFeatureStatisticsList:
    """Reads a statistics file written by `build`."""
    with gfile.GFile(path, "rb") as f:
        return statistics_pb2.DatasetFeatureStatisticsList.FromString(f.read())


def feature(
    dataset: statistics_pb2.DatasetFeatureStatistics, name: str
) -> statistics_pb2.FeatureNameStatistics | None:
    """The statistics of one feature by name, or None."""
    for candidate in dataset.features:
        if ".".join(candidate.path.step) == name or candidate.name == name:
            return candidate
    return None


def label_distribution(dataset: statistics_pb2.DatasetFeatureStatistics) -> np.ndarray:
    """Each class's share of the examples, from the label histogram (empty without labels)."""
    label = feature(dataset, LABEL_FEATURE)
    if label is None or not label.num_stats.histograms:
        return np.zeros(0)
    counts = np.array([b.sample_count for b in label.num_stats.histograms[0].buckets])
    return counts / counts.sum() if counts.sum() else counts
