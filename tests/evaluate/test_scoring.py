"""The metrics read off the confusion matrix, against counts worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from evaluate import scoring

# Three classes; class 2 is never predicted and class 1 has one example. Rows: true class.
#   true 0: predicted 0, 0, 1      true 1: predicted 1      true 2: predicted 0, 1
LABELS = np.array([0, 0, 0, 1, 2, 2])
PREDICTIONS = np.array([0, 0, 1, 1, 0, 1])
NAMES = ["a", "b", "c"]


def one_hot(predictions: np.ndarray, num_classes: int) -> np.ndarray:
    """Softmax-like rows whose argmax is each prediction."""
    probabilities = np.full((len(predictions), num_classes), 0.1, np.float32)
    probabilities[np.arange(len(predictions)), predictions] = 0.8
    return probabilities


def test_confusion_matrix_counts_true_rows_and_predicted_columns():
    matrix = scoring.confusion_matrix(LABELS, PREDICTIONS, 3)
    assert matrix.tolist() == [[2, 1, 0], [0, 1, 0], [1, 1, 0]]


def test_per_class_and_macro_metrics_match_hand_computed_values():
    metrics = scoring.score(LABELS, one_hot(PREDICTIONS, 3), NAMES)
    a, b, c = (metrics["per_class"][name] for name in NAMES)
    assert (a["precision"], a["recall"], a["support"]) == (pytest.approx(2 / 3), 2 / 3, 3)
    assert a["f1"] == pytest.approx(2 / 3)
    # b: one of three predictions right, its one example found.
    assert (b["precision"], b["recall"], b["support"]) == (pytest.approx(1 / 3), 1.0, 1)
    assert b["f1"] == pytest.approx(0.5)
    # c: never predicted, so precision 0 (not NaN), and neither example found.
    assert (c["precision"], c["recall"], c["f1"], c["support"]) == (0.0, 0.0, 0.0, 2)
    assert metrics["accuracy"] == pytest.approx(3 / 6)
    assert metrics["num_examples"] == 6
    macro = metrics["macro_avg"]
    assert macro["precision"] == pytest.approx((2 / 3 + 1 / 3 + 0) / 3)
    assert macro["recall"] == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert macro["f1"] == pytest.approx((2 / 3 + 0.5 + 0) / 3)


def test_a_class_absent_from_the_split_has_recall_zero_not_nan():
    labels = np.array([0, 0, 1])
    metrics = scoring.score(labels, one_hot(np.array([0, 2, 1]), 3), NAMES)
    absent = metrics["per_class"]["c"]
    assert (absent["precision"], absent["recall"], absent["f1"], absent["support"]) == (
        0.0,
        0.0,
        0.0,
        0,
    )
    assert metrics["per_class"]["a"]["recall"] == pytest.approx(0.5)


def test_a_model_with_another_class_count_is_refused():
    with pytest.raises(ValueError, match="outputs 4 classes but the dataset has 3"):
        scoring.score(LABELS, one_hot(PREDICTIONS, 4), NAMES)


def test_a_label_outside_the_classes_is_refused_in_one_sentence():
    labels = np.array([0, 3, 1])
    with pytest.raises(ValueError, match="holds label 3, outside the 3 classes"):
        scoring.score(labels, one_hot(np.array([0, 1, 1]), 3), NAMES)


def test_expected_calibration_error_and_its_bins():
    from evaluate import predictions

    # Four examples at 0.95 confidence, three right; two at 0.55, both wrong.
    preds = predictions.Predictions(
        labels=np.array([0, 0, 0, 1, 2, 2]),
        predicted=np.array([0, 0, 0, 0, 1, 1]),
        confidence=np.array([0.95, 0.95, 0.95, 0.95, 0.55, 0.55], np.float32),
    )
    calibration = predictions.calibration(preds, bins=10)
    assert calibration["count"] == [0, 0, 0, 0, 0, 2, 0, 0, 0, 4]
    assert calibration["accuracy"][9] == 0.75 and calibration["accuracy"][5] == 0.0
    assert calibration["accuracy"][0] is None and calibration["confidence"][0] is None
    expected = (4 * abs(0.75 - 0.95) + 2 * abs(0.0 - 0.55)) / 6
    assert calibration["ece"] == pytest.approx(expected, rel=1e-6)
    perfect = predictions.Predictions(
        labels=np.array([0, 1]), predicted=np.array([0, 1]), confidence=np.ones(2, np.float32)
    )
    assert predictions.calibration(perfect)["ece"] == pytest.approx(0.0, abs=1e-7)
