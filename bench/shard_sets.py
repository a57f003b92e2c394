"""Real-image shard sets written without the Beam stage, for benchmarks and tests (not shipped).

`write_shard_set` writes a shard set that follows the contract (records, layout, manifest) from
Fashion-MNIST images read straight from the IDX files in .cache/fashion-mnist (`make dataset`),
so train and evaluate benchmarks and tests start in a second.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import pathlib
from typing import Any

import numpy as np
import tensorflow as tf

from contract import atomic, layout, manifest, records
from preprocess.scaled_dataset import CLASS_NAMES, read_idx

PROJECT_ROOT = pathlib.Path(__file__).resolve().parents[1]
FASHION_MNIST_DIR = PROJECT_ROOT / ".cache" / "fashion-mnist"

__all__ = [
    "CLASS_NAMES",
    "FASHION_MNIST_DIR",
    "PROJECT_ROOT",
    "fashion_mnist_arrays",
    "read_idx",
    "write_shard_set",
]


def fashion_mnist_arrays(split: str, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The first `count` images (N,28,28,1 uint8) and labels of the real train or t10k split."""
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(FASHION_MNIST_DIR / f"{prefix}-images-idx3-ubyte.gz")[:count]
    labels = read_idx(FASHION_MNIST_DIR / f"{prefix}-labels-idx1-ubyte.gz")[:count]
    return images[..., np.newaxis], labels.astype(np.int64)


def _write_records(path: str, images: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.TFRecordWriter(path) as writer:
        for image, label in zip(images, labels, strict=True):
            writer.write(records.encode_example(image, int(label)))
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return {
        "num_examples": len(labels),
        "sha256": digest,
        "size_bytes": os.path.getsize(path),
    }


def write_shard_set(
    data_dir: str,
    num_workers: int = 2,
    per_worker: int = 256,
    num_validation: int = 200,
    num_eval: int = 300,
    source_images: int | None = None,
    validate_on_test: bool = False,
    mislabel_validation: bool = False,
) -> dict[str, Any]:
    """Writes a contract-conforming shard set of real Fashion-MNIST images; returns its manifest.

    `source_images` (at most 60,000) real images are repeated as often as the train and
    validation examples need: a shard set larger than Fashion-MNIST itself.
    `validate_on_test`: the validation split is the eval split's first `num_validation` test
    images, so each epoch's validation accuracy is a test accuracy.
    `mislabel_validation`: each validation label is moved to the next class, so the validation
    loss rises with every epoch that teaches the model more, whatever the CPU's rounding: early
    stopping ends a run at the earliest epoch its patience allows.
    """
    n_train = per_worker * num_workers
    wanted = n_train + (0 if validate_on_test else num_validation)
    images, labels = fashion_mnist_arrays("train", min(wanted, source_images or wanted))
    if len(labels) < wanted:
        repeats = -(-wanted // len(labels))
        images = np.concatenate([images] * repeats)[:wanted]
        labels = np.concatenate([labels] * repeats)[:wanted]
    eval_images, eval_labels = fashion_mnist_arrays("test", num_eval)
    validation = (images[n_train:], labels[n_train:])
    if validate_on_test:
        validation = fashion_mnist_arrays("test", num_validation)
    if mislabel_validation:
        validation = (validation[0], (validation[1] + 1) % len(CLASS_NAMES))
    files = []
    for worker in range(num_workers):
        rel = layout.worker_file_name(worker, num_workers, 0, 1)
        part = slice(worker * per_worker, (worker + 1) * per_worker)
        info = _write_records(os.path.join(data_dir, rel), images[part], labels[part])
        files.append({"path": rel, "split": layout.TRAIN_SPLIT, "worker": worker, **info})
    for split, (imgs, labs) in {
        layout.VALIDATION_SPLIT: validation,
        layout.EVAL_SPLIT: (eval_images, eval_labels),
    }.items():
        rel = layout.whole_split_file_name(split, 0, 1)
        info = _write_records(os.path.join(data_dir, rel), imgs, labs)
        files.append({"path": rel, "split": split, "worker": None, **info})
    doc = {
        "schema_version": manifest.SCHEMA_VERSION,
        "dataset": {
            "name": "fashion_mnist",
            "version": "3.0.1",
            "train_split": "train",
            "eval_split": "test",
        },
        "parameters": {"num_workers": num_workers, "source": "bench.shard_sets"},
        "num_workers": num_workers,
        "image_shape": [28, 28, 1],
        "num_classes": 10,
        "class_names": CLASS_NAMES,
        "feature_spec": {"image": "bytes: raw uint8 HxWxC", "label": "int64 class index"},
        "splits": {
            layout.TRAIN_SPLIT: {
                "num_examples": n_train,
                "examples_per_worker": per_worker,
                "leftover_examples": 0,
            },
            layout.VALIDATION_SPLIT: {"num_examples": num_validation},
            layout.EVAL_SPLIT: {"num_examples": num_eval},
        },
        "files": files,
        "code_version": "bench.shard_sets",
        "created_utc": datetime.datetime.now(datetime.UTC).isoformat(),
    }
    atomic.write_json_atomic(os.path.join(data_dir, layout.MANIFEST_FILE), doc)
    return doc
