"""The train stage: multi-worker tf-keras training on the preprocess stage's shard set."""

import os

# oneDNN's kernels, set before anything below imports TensorFlow. TensorFlow turns them on by
# itself only on CPUs with AVX512-VNNI, AVX-VNNI, AVX512-BF16 or AMX; on AVX2-only CPUs (the AMD
# EPYC VMs) it falls back to Eigen, and there the Train stage ran cnn3 2.3x slower
# (BENCHMARKS.md). A value the user set is kept; which library a worker runs is part of the
# settings its backup and its peers must share (train.backup.fingerprint).
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
os.environ.setdefault(ONEDNN_ENV, "1")

from typing import Any  # noqa: E402

from train.config import TrainConfig  # noqa: E402

__all__ = ["ONEDNN_ENV", "TrainConfig", "run"]


def __getattr__(name: str) -> Any:
    # `train.run` imports TensorFlow on first use: Luigi's process reads TrainConfig only.
    if name == "run":
        from train.worker import run

        return run
    raise AttributeError(f"module 'train' has no attribute {name!r}")
