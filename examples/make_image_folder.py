"""Writes a tiny image folder to try the pipeline on: ROOT/<class name>/<n>.png, deterministic.

    python examples/make_image_folder.py /tmp/shapes            # 3 classes x 60 images, 16x16

Each class is a shape (a filled square, a horizontal bar, a vertical bar) drawn in grey on a
dark background at a position and brightness drawn from `--seed`, with a little noise: easy
enough that a small model learns it in a few epochs, and the same bytes on every machine.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import zlib

import numpy as np

CLASSES = ("bar", "column", "square")  # sorted: the label of each is its index here


def draw(class_name: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """One size x size x 1 uint8 image of `class_name`'s shape."""
    image = rng.integers(0, 40, (size, size, 1)).astype(np.int32)
    third = max(2, size // 3)
    top, left = (int(v) for v in rng.integers(0, size - third, 2))
    brightness = int(rng.integers(150, 256))
    if class_name == "bar":
        image[top : top + max(1, third // 2), :] = brightness
    elif class_name == "column":
        image[:, left : left + max(1, third // 2)] = brightness
    else:
        image[top : top + third, left : left + third] = brightness
    return image.clip(0, 255).astype(np.uint8)


def png_bytes(image: np.ndarray) -> bytes:
    """A height x width x 1 uint8 array as an 8-bit greyscale PNG file's bytes."""
    height, width = image.shape[:2]

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    rows = b"".join(b"\x00" + image[row, :, 0].tobytes() for row in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows, 9))
        + chunk(b"IEND", b"")
    )


def make_image_folder(root: str, per_class: int = 60, size: int = 16, seed: int = 0) -> list[str]:
    """Writes `per_class` PNGs of each class under `root`; returns the class names."""
    rng = np.random.default_rng(seed)
    for class_name in CLASSES:
        folder = os.path.join(root, class_name)
        os.makedirs(folder, exist_ok=True)
        for index in range(per_class):
            png = png_bytes(draw(class_name, size, rng))
            with open(os.path.join(folder, f"{index:04d}.png"), "wb") as f:
                f.write(png)
    return list(CLASSES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="folder to write the classes' folders into")
    parser.add_argument("--per-class", type=int, default=60, help="images per class (default 60)")
    parser.add_argument("--size", type=int, default=16, help="image height and width (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the drawing (default 0)")
    args = parser.parse_args(argv)
    classes = make_image_folder(args.root, args.per_class, args.size, args.seed)
    print(f"wrote {args.per_class} images of each of {', '.join(classes)} to {args.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
