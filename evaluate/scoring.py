"""Scoring a model on a finite split: one inference pass, then library metrics on the result.

Loss is Keras's sparse categorical cross-entropy and accuracy, precision, recall, F1 and the
confusion matrix come from scikit-learn, so the numbers match `model.evaluate` and the
textbook definitions without re-deriving either here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras
from sklearn import metrics as skm


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
    class_ids = list(range(num_classes))
    predictions = probabilities.argmax(axis=1)
    loss = tf_keras.losses.SparseCategoricalCrossentropy()(labels, probabilities)
    precision, recall, f1, support = skm.precision_recall_fscore_support(
        labels, predictions, labels=class_ids, zero_division=0
    )
    macro = skm.precision_recall_fscore_support(
        labels, predictions, labels=class_ids, average="macro", zero_division=0
    )
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
        "accuracy": float(skm.accuracy_score(labels, predictions)),
        "num_examples": int(labels.shape[0]),
        "per_class": per_class,
        "macro_avg": {
            "precision": float(macro[0]),
            "recall": float(macro[1]),
            "f1": float(macro[2]),
        },
        "confusion_matrix": {
            "labels": list(class_names),
            "rows": "true class",
            "columns": "predicted class",
            "matrix": skm.confusion_matrix(labels, predictions, labels=class_ids).tolist(),
        },
    }
