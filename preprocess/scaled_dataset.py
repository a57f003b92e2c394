"""Fashion-MNIST at any size: TFDS `fashion_mnist_scaled/x<N>`, N deterministic copies of train.

Copy 0 of the train split is the real 60,000 images; copy k > 0 of image i is that image moved
by a non-zero offset of up to two pixels, mirrored left-right or not, with noise of up to
`NOISE` grey levels on its non-black pixels, all drawn from a hash of (k, i). The same (k, i)
gives the same pixels on every machine, so two builds write the same examples. The test split
is always the real 10,000 test images, unperturbed, so models trained at any size are scored on
the same set.

Examples are generated a block of source images at a time and PNG-encoded here with zlib
(about 4x cheaper than TFDS's per-image TensorFlow encoder), so building x100 (6,000,000 train
examples) needs memory for the source arrays and one block, plus TFDS's writer, which keeps up
to 1 GB of encoded examples in memory before it spills them to bucket files on disk.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import re
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

IMAGE_SHAPE = (28, 28, 1)
CLASS_NAMES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
SOURCE_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
MAX_SHIFT = 2
NOISE = 8
BLOCK_SIZE = 4096
# Every (dx, dy) with |dx|, |dy| <= MAX_SHIFT except (0, 0): a perturbed copy always moves.
OFFSETS = np.array(
    [
        (dx, dy)
        for dy in range(-MAX_SHIFT, MAX_SHIFT + 1)
        for dx in range(-MAX_SHIFT, MAX_SHIFT + 1)
        if (dx, dy) != (0, 0)
    ],
    dtype=np.int64,
)
CONFIG_NAME = re.compile(r"x([1-9][0-9]*)")


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Reads a gzipped IDX file (the MNIST format) into a uint8 numpy array of its shape."""
    with tf.io.gfile.GFile(os.fspath(path), "rb") as raw, gzip.GzipFile(fileobj=raw) as f:
        data = f.read()
    ndim = data[3]
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a well-spread 64-bit hash of each uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def perturb(images: np.ndarray, copy: int, indices: np.ndarray) -> np.ndarray:
    """Copy `copy` of `images` (B,H,W,C uint8), source image `indices[b]` for row b.

    Copy 0 is the images themselves. Otherwise each image is shifted by one of `OFFSETS`
    (uncovered pixels are black), mirrored left-right with probability 1/2, and its non-black
    pixels get uniform integer noise in [-NOISE, NOISE]; every choice is a hash of
    (copy, index), so the result does not depend on how images are grouped into blocks.
    """
    if copy == 0:
        return images
    batch, height, width, channels = images.shape
    with np.errstate(over="ignore"):
        h = _mix((np.uint64(copy) << np.uint64(40)) ^ indices.astype(np.uint64))
    offset = OFFSETS[(h % np.uint64(len(OFFSETS))).astype(np.int64)]
    flip = ((h >> np.uint64(32)) & np.uint64(1)).astype(bool)
    rows = np.arange(height)[None, :] - offset[:, 1:2] + MAX_SHIFT
    cols = np.arange(width)[None, :]
    cols = np.where(flip[:, None], width - 1 - cols, cols) - offset[:, 0:1] + MAX_SHIFT
    padded = np.pad(images, ((0, 0), (MAX_SHIFT,) * 2, (MAX_SHIFT,) * 2, (0, 0)))
    moved = padded[np.arange(batch)[:, None, None], rows[:, :, None], cols[:, None, :]]
    pixels = np.arange(height * width * channels, dtype=np.uint64).reshape(
        1, height, width, channels
    )
    with np.errstate(over="ignore"):
        bits = _mix(h[:, None, None, None] + pixels * np.uint64(0x9E3779B97F4A7C15))
    noise = (bits % np.uint64(2 * NOISE + 1)).astype(np.int16) - NOISE
    noisy = np.clip(moved.astype(np.int16) + noise, 0, 255).astype(np.uint8)
    return np.where(moved > 0, noisy, moved)


def _png_chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def encode_png(images: np.ndarray) -> list[bytes]:
    """Lossless 8-bit greyscale PNGs of `images` (B,H,W,1 uint8), one zlib call per image."""
    batch, height, width, _ = images.shape
    header = b"\x89PNG\r\n\x1a\n" + _png_chunk(
        b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    )
    end = _png_chunk(b"IEND", b"")
    rows = np.zeros((batch, height, width + 1), dtype=np.uint8)  # filter byte 0 per row
    rows[:, :, 1:] = images[..., 0]
    return [header + _png_chunk(b"IDAT", zlib.compress(r.tobytes())) + end for r in rows]


@dataclasses.dataclass(eq=False)
class ScaleConfig(tfds.core.BuilderConfig):
    """`x<factor>`: the train split holds `factor` copies of Fashion-MNIST's train images."""

    factor: int = 1


def scale_config(name: str) -> ScaleConfig | None:
    """The config `x<N>` (N >= 1) names, or None when `name` is not of that form."""
    match = CONFIG_NAME.fullmatch(name)
    if not match:
        return None
    factor = int(match.group(1))
    return ScaleConfig(
        name=name,
        factor=factor,
        description=f"{factor} copies of the train split (copy 0 the real images)",
    )


class FashionMnistScaled(tfds.core.GeneratorBasedBuilder):
    """Fashion-MNIST with the train split scaled by a whole factor; see the module docstring."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Shift, mirror and noise copies of the train split."}
    BUILDER_CONFIGS = [c for c in map(scale_config, ("x1", "x10", "x100")) if c is not None]
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Place Fashion-MNIST's four IDX files (train-images-idx3-ubyte.gz, ...) in the manual "
        "folder: `make dataset` puts them in .cache/fashion-mnist."
    )
    # The source files are Fashion-MNIST's: the preprocess stage checks them against
    # preprocess/sources/fashion_mnist.sha256.
    SOURCE_SUMS = "fashion_mnist"

    @classmethod
    def get_builder_config(
        cls, name: str, version: str | tfds.core.Version | None = None
    ) -> tfds.core.BuilderConfig | None:
        """A listed config, or any `x<N>` built on demand (`fashion_mnist_scaled/x3`)."""
        return super().get_builder_config(name, version) or scale_config(name)

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description=__doc__,
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=IMAGE_SHAPE),
                    "label": tfds.features.ClassLabel(names=CLASS_NAMES),
                }
            ),
            supervised_keys=("image", "label"),
            homepage="https://github.com/zalandoresearch/fashion-mnist",
        )

    def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[tuple[int, dict]]]:
        factor = self.builder_config.factor
        folder = str(dl_manager.manual_dir)
        return {
            "train": self._generate_examples(folder, "train", factor),
            "test": self._generate_examples(folder, "test", 1),
        }

    def _generate_examples(
        self, folder: str, split: str, factor: int
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        images_file, labels_file = SOURCE_FILES[split]
        images = read_idx(f"{folder}/{images_file}")[..., np.newaxis]
        labels = read_idx(f"{folder}/{labels_file}")
        if len(images) != len(labels):
            raise ValueError(
                f"{folder}: {images_file} holds {len(images)} images but {labels_file} "
                f"{len(labels)} labels; run `make dataset` again"
            )
        count = len(images)
        for copy in range(factor):
            for start in range(0, count, BLOCK_SIZE):
                indices = np.arange(start, min(start + BLOCK_SIZE, count))
                encoded = encode_png(perturb(images[indices], copy, indices))
                for index, png in zip(indices, encoded, strict=True):
                    key = copy * count + int(index)
                    yield key, {"image": png, "label": int(labels[index])}
