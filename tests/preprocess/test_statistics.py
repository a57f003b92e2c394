"""The statistics the Beam job writes beside the shards, checked against numpy."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_metadata.proto.v0 import statistics_pb2

from contract import layout, records
from preprocess import PreprocessConfig, run_preprocess, statistics


def write_split(path, images: np.ndarray, labels: np.ndarray) -> None:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for image, label in zip(images, labels, strict=True):
            writer.write(records.encode_example(image, int(label)))


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A tiny TFRecord dataset (7x5x1 images, 4 classes, 90 train and 30 test) through the
    stage: (train images, train labels, test images, test labels, manifest, data dir)."""
    folder = tmp_path_factory.mktemp("tiny")
    rng = np.random.default_rng(7)
    images = rng.integers(0, 256, (120, 7, 5, 1), dtype=np.uint8)
    images[:10] = 0  # zeros and both extremes are counted
    images[10, 0, 0, 0] = 255
    labels = rng.choice(4, size=120, p=[0.1, 0.2, 0.3, 0.4])
    labels[0] = 3
    write_split(folder / "train.tfrecord", images[:90], labels[:90])
    write_split(folder / "test.tfrecord", images[90:], labels[90:])
    cfg = PreprocessConfig(
        output_root=str(folder / "runs"),
        date="2026-01-31",
        dataset=f"tfrecord:train={folder}/train.tfrecord,test={folder}/test.tfrecord",
        raw_image_shape="7x5x1",
        num_workers=2,
        read_chunk_size=16,
        batch_size=8,
    )
    doc = run_preprocess(cfg, ["--direct_num_workers=1"])
    data_dir = layout.data_dir(cfg.output_root, cfg.date)
    return images[:90], labels[:90], images[90:], labels[90:], doc, data_dir


def by_name(stats: statistics_pb2.DatasetFeatureStatisticsList, name: str):
    (dataset,) = [d for d in stats.datasets if d.name == name]
    return dataset


@pytest.mark.parametrize("part", ["train", "eval"])
def test_statistics_match_numpy(written, part):
    train_images, train_labels, test_images, test_labels, doc, data_dir = written
    images, labels = (train_images, train_labels) if part == "train" else (test_images, test_labels)
    entry = doc["statistics"]
    path = layout.join(data_dir, entry["path"])
    with open(path, "rb") as f:
        stats = statistics_pb2.DatasetFeatureStatisticsList.FromString(f.read())
    dataset = by_name(stats, part)
    assert dataset.num_examples == len(labels)
    image = statistics.feature(dataset, "image")
    pixels = images.reshape(-1).astype(np.float64)
    assert image.type == statistics_pb2.FeatureNameStatistics.INT
    assert image.num_stats.common_stats.num_non_missing == len(labels)
    assert image.num_stats.common_stats.max_num_values == 35
    assert image.num_stats.mean == pytest.approx(pixels.mean(), rel=1e-12)
    assert image.num_stats.std_dev == pytest.approx(pixels.std(), rel=1e-9)
    assert (image.num_stats.min, image.num_stats.max) == (pixels.min(), pixels.max())
    assert image.num_stats.num_zeros == int((pixels == 0).sum())
    buckets = image.num_stats.histograms[0].buckets
    assert [b.sample_count for b in buckets] == np.histogram(pixels, bins=16, range=(0, 256))[
        0
    ].tolist()
    label = statistics.feature(dataset, "label")
    assert [b.sample_count for b in label.num_stats.histograms[0].buckets] == np.bincount(
        labels, minlength=4
    ).tolist()
    assert label.num_stats.mean == pytest.approx(labels.mean(), rel=1e-12)
    assert label.num_stats.std_dev == pytest.approx(labels.std(), rel=1e-9)
    assert statistics.label_distribution(dataset) == pytest.approx(
        np.bincount(labels, minlength=4) / len(labels)
    )


def test_the_manifest_names_the_statistics_file_with_its_sha256(written):
    *_, doc, data_dir = written

    entry = doc["statistics"]
    with open(layout.join(data_dir, entry["path"]), "rb") as f:
        data = f.read()
    assert entry["sha256"] == hashlib.sha256(data).hexdigest() and entry["size_bytes"] == len(data)
    assert all("statistics" not in f for f in doc["files"])
