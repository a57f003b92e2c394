"""The preprocess stage: a dataset (TFDS, image folder, TFRecords) → balanced per-worker shards."""

from typing import Any

from preprocess.config import PreprocessConfig
from preprocess.errors import PreprocessError

__all__ = ["PreprocessConfig", "PreprocessError", "run", "run_preprocess"]


def __getattr__(name: str) -> Any:
    # The Beam job is imported on first use, so tools beside it (the Dask cluster command)
    # start without loading Beam and TensorFlow.
    if name in ("run", "run_preprocess"):
        from preprocess import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'preprocess' has no attribute '{name}'")
