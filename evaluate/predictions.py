"""Per-example predictions of one model on the eval split, kept beside metrics.json.

`predictions.npz` (the candidate) and `baseline_predictions.npz` (the last blessed model on the
same examples, in the same order) hold, per example: the label, the predicted class, whether
it is right and the predicted class's probability. They are what the paired comparison
(evaluate.paired) and the calibration figures are computed from, and they let anyone recompute
the verdict later.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np

from contract import atomic, gfile

CANDIDATE_FILE = "predictions.npz"
BASELINE_FILE = "baseline_predictions.npz"

# Expected calibration error's bins, equal-width over the top-class probability.
CALIBRATION_BINS = 15


@dataclasses.dataclass(frozen=True)
class Predictions:
    """One model's outcome on each example of a split, in split order.

    Attributes:
        labels: true class indices [N].
        predicted: predicted class indices [N].
        confidence: the predicted class's probability [N].
    """

    labels: np.ndarray
    predicted: np.ndarray
    confidence: np.ndarray

    @classmethod
    def from_probabilities(cls, labels: np.ndarray, probabilities: np.ndarray) -> Predictions:
        """From the labels and the model's softmax output [N, classes]."""
        predicted = probabilities.argmax(axis=1)
        confidence = probabilities[np.arange(predicted.shape[0]), predicted]
        return cls(
            labels=labels.astype(np.int32),
            predicted=predicted.astype(np.int32),
            confidence=confidence.astype(np.float32),
        )

    @property
    def correct(self) -> np.ndarray:
        return self.labels == self.predicted

    def write(self, path: str) -> None:
        """Writes the compressed .npz atomically (local or gs://)."""
        buffer = io.BytesIO()
        np.savez_compressed(
            buffer,
            label=self.labels,
            predicted=self.predicted,
            correct=self.correct,
            confidence=self.confidence,
        )
        atomic.write_bytes_atomic(path, buffer.getvalue())


def read(path: str) -> Predictions:
    """Reads a predictions file written by `Predictions.write`."""
    with gfile.GFile(path, "rb") as f:
        arrays = np.load(io.BytesIO(f.read()))
        return Predictions(
            labels=arrays["label"], predicted=arrays["predicted"], confidence=arrays["confidence"]
        )


def calibration(predictions: Predictions, bins: int = CALIBRATION_BINS) -> dict[str, object]:
    """Expected calibration error and the reliability diagram's bins.

    Each example falls in the equal-width bin of its top-class probability; the ECE is the
    example-weighted mean gap between a bin's accuracy and its mean confidence.

    Returns:
        `ece`, `bins` and per bin (lowest first) `count`, `accuracy` and `confidence` (None for
        an empty bin).
    """
    n = int(predictions.labels.shape[0])
    edges = np.linspace(0.0, 1.0, bins + 1)
    # A probability of exactly 1 belongs to the top bin.
    index = np.clip(np.digitize(predictions.confidence, edges[1:-1], right=True), 0, bins - 1)
    counts = np.bincount(index, minlength=bins)
    hits = np.bincount(index, weights=predictions.correct.astype(np.float64), minlength=bins)
    confidence_sums = np.bincount(
        index, weights=predictions.confidence.astype(np.float64), minlength=bins
    )
    filled = counts > 0
    accuracy = np.divide(hits, counts, out=np.zeros(bins), where=filled)
    confidence = np.divide(confidence_sums, counts, out=np.zeros(bins), where=filled)
    ece = float((counts * np.abs(accuracy - confidence)).sum() / n) if n else 0.0
    return {
        "ece": ece,
        "bins": bins,
        "count": counts.astype(int).tolist(),
        "accuracy": [float(a) if f else None for a, f in zip(accuracy, filled, strict=True)],
        "confidence": [float(c) if f else None for c, f in zip(confidence, filled, strict=True)],
    }
