"""The real Fashion-MNIST: TFDS build from the Debian files, sharded for two workers."""

from __future__ import annotations

import pytest

from contract import layout, manifest
from preprocess import PreprocessConfig, run_preprocess
from tests import factories


@pytest.mark.e2e
def test_real_fashion_mnist_two_workers(tmp_path):
    cfg = PreprocessConfig(
        output_root=str(tmp_path / "runs"),
        date="2026-01-31",
        num_workers=2,
        validation_fraction=0.1,
        data_dir=str(tmp_path / "tfds"),
        manual_dir=str(factories.FASHION_MNIST_DIR),
    )
    doc = run_preprocess(cfg)
    data_dir = layout.data_dir(cfg.output_root, cfg.date)
    assert manifest.verify(data_dir) == doc
    assert doc["splits"]["train"] == {
        "num_examples": 54000,
        "examples_per_worker": 27000,
        "leftover_examples": 0,
    }
    assert doc["splits"]["validation"]["num_examples"] == 6000
    assert doc["splits"]["eval"]["num_examples"] == 10000
    # None of Fashion-MNIST's test images has the pixels of one of its train images.
    assert doc["splits"]["eval"]["duplicates_in_training"] == 0
    for worker in (0, 1):
        entries = manifest.file_entries(doc, "train", worker)
        assert sum(e["num_examples"] for e in entries) == 27000
    assert doc["class_names"] == factories.CLASS_NAMES and doc["image_shape"] == [28, 28, 1]
    assert doc["dataset"]["version"] == "3.0.1"
