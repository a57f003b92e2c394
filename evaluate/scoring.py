"""Scoring a model on a finite split: one inference pass, then the metrics of the result.

Loss is Keras's sparse categorical cross-entropy, so it matches `model.evaluate`. Accuracy,
precision, recall, F1 and their macro averages are read off the confusion matrix by their
textbook definitions (scikit-learn's, with `zero_division=0`: a class never predicted has
precision 0, a class absent from the split recall 0, and F1 is 0 where both are).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras


def predict_split(model: tf_keras.Model, dataset: tf.data.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Runs the model over every batch once.

    Returns:
        (labels [N] int64, probabilities [N, num_classes] float32), in dataset order.
    """

    @tf.function(reduce_retracing=True)
    def infer(images: tf.Tensor) -> tf.Tensor:
        return model(images, training=False)

    labels, probabilities = [], []
    for images, batch_labels in dataset:
        probabilities.append(infer(images).numpy())
        labels.append(batch_labels.numpy())
    if not labels:
        return np.zeros([0], np.int64), np.zeros([0, 0], np.float32)
    return np.concatenate(labels), np.concatenate(probabilities)


def score(labels: np.ndarray, probabilities: np.ndarray, class_names: list[str]) -> dict[str, Any]:
    """The metrics of one evaluation as a JSON-ready name -> value dict.

    Args:
        labels: true class indices [N].
        probabilities: the model's softmax output [N, num_classes].
        class_names: names of the classes, by index.

    Returns:
        loss, accuracy, example count, per-class precision/recall/F1/support keyed by class
        name, their macro averages and the confusion matrix (rows: true, columns: predicted).
    """
    num_classes = len(class_names)
    if probabilities.shape[1] != num_classes:
        raise ValueError(
            f"the model outputs {probabilities.shape[1]} classes but the dataset has "
            f"{num_classes}; was it trained on another dataset?"
        )
    outside = labels[(labels < 0) | (labels >= num_classes)]
    if outside.size:
        raise ValueError(
            f"the split holds label {int(outside[0])}, outside the {num_classes} classes its "
            "manifest names: rerun preprocess"
        )
    predictions = probabilities.argmax(axis=1)
    loss = tf_keras.losses.SparseCategoricalCrossentropy()(labels, probabilities)
    matrix = confusion_matrix(labels, predictions, num_classes)
    hits = np.diag(matrix).astype(np.float64)
    support = matrix.sum(axis=1)
    precision = _ratio(hits, matrix.sum(axis=0))
    recall = _ratio(hits, support)
    f1 = _ratio(2 * precision * recall, precision + recall)
    per_class = {
        name: {
            "index": i,
            "precision": float(precision[i]),
            "recall": float(recall[i]),
            "f1": float(f1[i]),
            "support": int(support[i]),
        }
        for i, name in enumerate(class_names)
    }
    return {
        "loss": float(loss.numpy()),
        "accuracy": float(hits.sum() / labels.shape[0]) if labels.shape[0] else 0.0,
        "num_examples": int(labels.shape[0]),
        "per_class": per_class,
        "macro_avg": {
            "precision": float(precision.mean()),
            "recall": float(recall.mean()),
            "f1": float(f1.mean()),
        },
        "confusion_matrix": {
            "labels": list(class_names),
            "rows": "true class",
            "columns": "predicted class",
            "matrix": matrix.tolist(),
        },
    }


def confusion_matrix(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> np.ndarray:
    """Counts [num_classes, num_classes]: rows the true class, columns the predicted one."""
    pairs = labels.astype(np.int64) * num_classes + predictions.astype(np.int64)
    counts = np.bincount(pairs, minlength=num_classes * num_classes)
    return counts.reshape(num_classes, num_classes)


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator elementwise, 0 where the denominator is 0."""
    out = np.zeros(numerator.shape, np.float64)
    np.divide(numerator, denominator, out=out, where=denominator != 0)
    return out


def accuracy_by_day(days: np.ndarray, correct: np.ndarray) -> list[dict[str, Any]]:
    """Accuracy on the examples of each drop day, oldest day first.

    Args:
        days: each example's day, YYYY-MM-DD ("" for one without).
        correct: whether the model got each example right.

    Returns:
        One {"day", "num_examples", "accuracy"} per day; the examples without a day, if any,
        last, with day None.
    """
    out = []
    for day in sorted(set(days.tolist()), key=lambda d: (d == "", d)):
        chosen = days == day
        out.append(
            {
                "day": day or None,
                "num_examples": int(chosen.sum()),
                "accuracy": float(correct[chosen].mean()),
            }
        )
    return out
