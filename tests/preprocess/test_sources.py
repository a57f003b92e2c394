"""Offline TFDS builds: recorded sums are enforced, the real builder runs on tiny files."""

from __future__ import annotations

import shutil

import pytest

from preprocess import sources
from preprocess.errors import PreprocessError
from tests.preprocess import conftest


def test_real_builder_on_tiny_files(tiny_tfds):
    import tensorflow_datasets as tfds

    builder = tfds.builder("fashion_mnist", data_dir=tiny_tfds)
    spec = sources.describe(builder)
    assert spec.split_sizes == {"train": conftest.TINY_TRAIN, "test": conftest.TINY_TEST}
    assert spec.image_shape == [28, 28, 1]
    assert spec.class_names[0] == "T-shirt/top" and len(spec.class_names) == 10
    assert (spec.image_key, spec.label_key) == ("image", "label")
    # TFDS shuffles at build time, so compare the sets of images.
    batch = next(iter(builder.as_dataset(split="train").batch(conftest.TINY_TRAIN)))
    expected, _ = conftest.factories.fashion_mnist_arrays("train", conftest.TINY_TRAIN)
    assert sorted(i.tobytes() for i in batch["image"].numpy()) == sorted(
        i.tobytes() for i in expected
    )


def test_prepared_dataset_is_reused_without_sources(tiny_tfds, tmp_path):
    builder = sources.prepare_dataset(
        "fashion_mnist", tiny_tfds, str(tmp_path / "empty"), str(tmp_path / "no.sha256")
    )
    assert builder.info.splits["train"].num_examples == conftest.TINY_TRAIN


def test_recorded_sums_match_the_real_files():
    sums = sources.read_sums_file(sources.recorded_checksums_path("fashion_mnist"))
    sizes = sources.verify_manual_files(
        str(conftest.factories.FASHION_MNIST_DIR), sums, "fashion_mnist.sha256"
    )
    assert set(sizes) == set(conftest.SOURCE_FILES)


def test_missing_source_file_is_named(tiny_sources, tmp_path):
    manual = tmp_path / "manual"
    shutil.copytree(tiny_sources[0], manual)
    (manual / "train-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(PreprocessError, match=r"source file missing: .*train-labels-idx1"):
        sources.prepare_dataset(
            "fashion_mnist", str(tmp_path / "tfds"), str(manual), tiny_sources[1]
        )
    assert not (tmp_path / "tfds" / "fashion_mnist").exists()


def test_checksum_mismatch_is_named(tiny_sources, tmp_path):
    manual = tmp_path / "manual"
    shutil.copytree(tiny_sources[0], manual)
    path = manual / "t10k-labels-idx1-ubyte.gz"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(PreprocessError, match=r"checksum mismatch: .*t10k-labels-idx1-ubyte.gz"):
        sources.prepare_dataset(
            "fashion_mnist", str(tmp_path / "tfds"), str(manual), tiny_sources[1]
        )


def test_unknown_dataset():
    with pytest.raises(PreprocessError, match="unknown TFDS dataset 'no_such_dataset'"):
        sources.builder_class("no_such_dataset")


def test_malformed_sums_file(tmp_path):
    path = tmp_path / "bad.sha256"
    path.write_text("not-a-sum file.gz\n")
    with pytest.raises(PreprocessError, match=r"bad.sha256:1: expected"):
        sources.read_sums_file(str(path))
