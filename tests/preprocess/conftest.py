"""Fixtures of the preprocess tests: tiny Fashion-MNIST source files and a TFDS build of them."""

from __future__ import annotations

import gzip
import hashlib
import pathlib
import sys

import numpy as np
import pytest

from preprocess import PreprocessConfig
from tests import factories

TINY_TRAIN = 300
TINY_TEST = 100
SOURCE_FILES = {
    "train-images-idx3-ubyte.gz": ("train-images-idx3-ubyte.gz", TINY_TRAIN),
    "train-labels-idx1-ubyte.gz": ("train-labels-idx1-ubyte.gz", TINY_TRAIN),
    "t10k-images-idx3-ubyte.gz": ("t10k-images-idx3-ubyte.gz", TINY_TEST),
    "t10k-labels-idx1-ubyte.gz": ("t10k-labels-idx1-ubyte.gz", TINY_TEST),
}


def write_idx(path: pathlib.Path, array: np.ndarray) -> None:
    """Writes a uint8 array as a gzipped IDX file (the inverse of factories.read_idx)."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape
    )
    # mtime=0 keeps the gzip bytes, and so the sums, the same on every run.
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        f.write(header + array.tobytes())


def write_tiny_sources(folder: pathlib.Path) -> pathlib.Path:
    """Cuts the first images of the real IDX files into `folder`; returns its sums file."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, (source, count) in SOURCE_FILES.items():
        write_idx(folder / name, factories.read_idx(factories.FASHION_MNIST_DIR / source)[:count])
        digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        lines.append(f"{digest}  {name}\n")
    sums = folder / "tiny.sha256"
    sums.write_text("".join(lines))
    return sums


def build_tiny_tfds(data_dir: str, manual_dir: str, sums: str) -> object:
    """Builds the real TFDS fashion_mnist builder on the tiny files.

    TFDS's MNIST builder reads a fixed 60000/10000 examples; its module constants are sized
    down to the tiny files for the build only.
    """
    import tensorflow_datasets as tfds

    from preprocess import sources

    module = sys.modules[tfds.builder_cls("fashion_mnist").__module__]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, "_TRAIN_EXAMPLES", TINY_TRAIN)
        mp.setattr(module, "_TEST_EXAMPLES", TINY_TEST)
        return sources.prepare_dataset("fashion_mnist", data_dir, manual_dir, sums)


def tiny_full_run_flags(tfds_dir: str, manual_dir: str, sums: str) -> list[str]:
    """The luigi flags of a tiny FullRun on a `build_tiny_tfds` build: the `mlp` for one epoch,
    Beam on one process, and a verdict by the baseline alone (no minimum accuracy)."""
    return [
        f"--Preprocess-data-dir={tfds_dir}",
        f"--Preprocess-manual-dir={manual_dir}",
        f"--Preprocess-manual-checksums={sums}",
        "--Preprocess-beam-args=--runner=DirectRunner --direct_num_workers=1",
        "--Train-model=mlp",
        "--Train-epochs=1",
        "--Train-warmup-epochs=0",  # luigi.cfg warms up for 1 epoch
        "--Train-per-worker-batch-size=32",
        "--Evaluate-min-accuracy=0",
    ]


@pytest.fixture(scope="session")
def tiny_sources(tmp_path_factory) -> tuple[str, str]:
    """(manual_dir, sums file) of tiny Fashion-MNIST IDX files."""
    folder = tmp_path_factory.mktemp("tiny-fashion-mnist")
    sums = write_tiny_sources(folder)
    return str(folder), str(sums)


@pytest.fixture(scope="session")
def tiny_tfds(tiny_sources, tmp_path_factory) -> str:
    """A TFDS data_dir holding fashion_mnist built from the tiny files (300 train, 100 test)."""
    data_dir = str(tmp_path_factory.mktemp("tfds"))
    build_tiny_tfds(data_dir, *tiny_sources)
    return data_dir


def tiny_config(tiny_tfds: str, tiny_sources: tuple[str, str], **overrides) -> PreprocessConfig:
    """A PreprocessConfig over the tiny dataset with `overrides`, which give its output_root."""
    values = {
        "date": "2026-01-31",
        "dataset": "fashion_mnist",
        "num_workers": 4,
        "validation_fraction": 0.1,
        "data_dir": tiny_tfds,
        "manual_dir": tiny_sources[0],
        "manual_checksums": tiny_sources[1],
        "read_chunk_size": 128,
        "batch_size": 50,
    }
    return PreprocessConfig(**(values | overrides))


@pytest.fixture
def make_config(tiny_tfds, tiny_sources, tmp_path):
    """Builds a PreprocessConfig over the tiny dataset, writing under tmp_path/runs."""

    def make(**overrides) -> PreprocessConfig:
        return tiny_config(
            tiny_tfds, tiny_sources, **({"output_root": str(tmp_path / "runs")} | overrides)
        )

    return make
