"""The evaluate stage's full-split evaluation against `model.evaluate` on the same model and data.

Both sides load the train stage's default CNN from model.keras and read the 10,000-example
Fashion-MNIST test split from TFRecord shards through the same input pipeline. The candidate
also computes everything the stage reports (per-class metrics, confusion matrix); the baseline
returns loss and accuracy only. Best of three runs each, examples per second.
"""

from __future__ import annotations

import os
import tempfile
import time

import tf_keras

from bench import shard_sets
from bench.result import Result
from contract import layout
from evaluate import EvaluateConfig, data, stage
from train import models

DATE = "2000-01-01"
REPEATS = 3
BATCH_SIZE = 1000


def _write_run(root: str) -> tuple[EvaluateConfig, dict]:
    doc = shard_sets.write_shard_set(
        layout.data_dir(root, DATE), per_worker=64, num_validation=64, num_eval=10_000
    )
    model = models.build("cnn", doc["image_shape"], doc["num_classes"])
    model.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    train_dir = layout.train_dir(root, DATE)
    os.makedirs(train_dir)
    model.save(os.path.join(train_dir, layout.MODEL_FILE))
    return EvaluateConfig(output_root=root, date=DATE, batch_size=BATCH_SIZE), doc


def _best_seconds(fn) -> float:
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def run() -> list[Result]:
    with tempfile.TemporaryDirectory() as root:
        config, doc = _write_run(root)
        count = data.expected_eval_count(doc)

        def candidate() -> None:
            metrics = stage.evaluate_split(config, doc)
            assert metrics["num_examples"] == count

        def baseline() -> None:
            model = tf_keras.models.load_model(config.model_path)
            model.evaluate(data.eval_dataset(config.data_dir, doc, BATCH_SIZE), verbose=0)

        baseline()  # warm the file cache and TensorFlow for both sides
        candidate_seconds = _best_seconds(candidate)
        baseline_seconds = _best_seconds(baseline)
    return [
        Result(
            benchmark="evaluate: full eval split (10,000 examples, cnn)",
            candidate="evaluate stage (predict + metrics)",
            baseline="tf_keras model.evaluate",
            candidate_value=count / candidate_seconds,
            baseline_value=count / baseline_seconds,
            unit="examples/s",
            target_ratio=1.0,
            notes=f"best of {REPEATS}, batch {BATCH_SIZE}, model load included on both sides",
        )
    ]
