"""Builders of small, real test inputs shared by the test tiers.

The shard-set maker lives in `bench.shard_sets` (benchmarks use it too, and bench/ does not
import tests/); the tests keep importing it from here.
"""

from __future__ import annotations

from bench.shard_sets import (
    CLASS_NAMES,
    FASHION_MNIST_DIR,
    PROJECT_ROOT,
    fashion_mnist_arrays,
    read_idx,
    write_shard_set,
)

__all__ = [
    "CLASS_NAMES",
    "FASHION_MNIST_DIR",
    "PROJECT_ROOT",
    "fashion_mnist_arrays",
    "read_idx",
    "write_shard_set",
]
