"""A run folder as the train stage leaves it: shard set, a briefly trained tiny model, history.

The model follows the train contract (float32 pixels 0-255 in, rescaling inside, softmax out)
and is trained for a few steps in this process, so evaluate tests start in seconds.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras

from contract import atomic, layout, manifest, records
from tests import factories


def read_split(data_dir: str, doc: dict[str, Any], split: str) -> tuple[np.ndarray, np.ndarray]:
    """A whole split as (float32 images 0-255, int64 labels) numpy arrays."""
    dataset = tf.data.TFRecordDataset(manifest.split_paths(data_dir, doc, split)).batch(4096)
    images, labels = [], []
    for serialized in dataset:
        batch_images, batch_labels = records.parse_batch(serialized, doc["image_shape"])
        images.append(batch_images.numpy().astype(np.float32))
        labels.append(batch_labels.numpy())
    return np.concatenate(images), np.concatenate(labels)


def tiny_model(image_shape: list[int], num_classes: int, seed: int = 0) -> tf_keras.Model:
    """A compiled softmax regression on raw pixels, rescaled inside the model."""
    tf_keras.utils.set_random_seed(seed)
    model = tf_keras.Sequential(
        [
            tf_keras.layers.Input(shape=image_shape),
            tf_keras.layers.Rescaling(1.0 / 255),
            tf_keras.layers.Flatten(),
            tf_keras.layers.Dense(num_classes, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=tf_keras.optimizers.Adam(0.01),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def write_trained_run(
    output_root: str, date: str, epochs: int = 2, seed: int = 0, **shard_kwargs: Any
) -> dict[str, Any]:
    """Writes `<output_root>/<date>/{data,train}` as preprocess and train would.

    Returns:
        {"manifest", "model_path", "history"}.
    """
    data_dir = layout.data_dir(output_root, date)
    doc = factories.write_shard_set(data_dir, **shard_kwargs)
    return train_on_shard_set(output_root, date, doc, epochs, seed)


def train_on_shard_set(
    output_root: str, date: str, doc: dict[str, Any], epochs: int = 2, seed: int = 0
) -> dict[str, Any]:
    """Trains the tiny model on `<output_root>/<date>/data` (manifest `doc`) and writes the
    train stage's files.

    Returns:
        {"manifest", "model_path", "history"}.
    """
    data_dir = layout.data_dir(output_root, date)
    train_images, train_labels = read_split(data_dir, doc, layout.TRAIN_SPLIT)
    val_images, val_labels = read_split(data_dir, doc, layout.VALIDATION_SPLIT)
    model = tiny_model(doc["image_shape"], doc["num_classes"], seed)
    fit = model.fit(
        train_images,
        train_labels,
        batch_size=64,
        epochs=epochs,
        validation_data=(val_images, val_labels),
        verbose=0,
    )
    train_dir = layout.train_dir(output_root, date)
    os.makedirs(train_dir, exist_ok=True)
    model_path = os.path.join(train_dir, layout.MODEL_FILE)
    model.save(model_path)
    history = {
        "history": {k: [float(v) for v in vs] for k, vs in fit.history.items()}
        | {"learning_rate": [0.01] * epochs},
        "epochs_completed": epochs,
        "stopped_early": False,
        "best_epoch": int(np.argmin(fit.history["val_loss"])) + 1,
        "steps_trained_total": epochs * int(np.ceil(len(train_labels) / 64)),
        "examples_per_second": 0.0,
        "wall_time_seconds": 0.0,
        "num_workers": 1,
        "global_batch_size": 64,
        "model": "tiny_softmax",
    }
    atomic.write_json_atomic(os.path.join(train_dir, layout.TRAIN_CONFIG_FILE), {"epochs": epochs})
    atomic.write_json_atomic(os.path.join(train_dir, layout.HISTORY_FILE), history)
    return {"manifest": doc, "model_path": model_path, "history": history}


def write_blessed_model(
    output_root: str, date: str, model: tf_keras.Model, recorded_accuracy: float
) -> dict[str, Any]:
    """Saves `model` as `<date>`'s model and points `latest.json` at it, as a blessing would.

    `recorded_accuracy` is what the pointer says it scored on its own night's eval set.

    Returns:
        The pointer written.
    """
    train_dir = layout.train_dir(output_root, date)
    os.makedirs(train_dir, exist_ok=True)
    model_path = os.path.join(train_dir, layout.MODEL_FILE)
    model.save(model_path)
    current = {
        "date": date,
        "model_path": f"{date}/train/{layout.MODEL_FILE}",
        "model_sha256": atomic.sha256_file(model_path),
        "accuracy": recorded_accuracy,
        "loss": 0.1,
        "dataset": "fashion_mnist",
    }
    atomic.write_json_atomic(os.path.join(output_root, layout.LATEST_POINTER_FILE), current)
    return current
