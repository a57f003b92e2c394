"""The train stage: multi-worker tf-keras training on the preprocess stage's shard set."""

from train.config import TrainConfig
from train.worker import run

__all__ = ["TrainConfig", "run"]
