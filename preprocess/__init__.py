"""The preprocess stage: TFDS dataset → deterministic, balanced per-worker TFRecord shards."""

from preprocess.config import PreprocessConfig
from preprocess.errors import PreprocessError
from preprocess.pipeline import run, run_preprocess

__all__ = ["PreprocessConfig", "PreprocessError", "run", "run_preprocess"]
