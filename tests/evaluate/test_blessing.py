"""Blessing decisions and the `latest` pointer, which moves only for a blessed run."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from contract import atomic, layout
from evaluate import blessing, run
from tests.evaluate.conftest import DATE

BASELINE = {"date": "2026-01-30", "accuracy": 0.90, "dataset": "fashion_mnist"}


def decide(accuracy=0.85, min_accuracy=None, max_regression=None, baseline=None, date=DATE):
    return blessing.decide(
        date=date,
        dataset="fashion_mnist",
        accuracy=accuracy,
        min_accuracy=min_accuracy,
        max_regression=max_regression,
        baseline=baseline,
    )


def test_first_run_without_thresholds_is_blessed_and_says_why():
    verdict = decide()
    assert verdict["blessed"] and verdict["moves_latest_pointer"]
    assert verdict["checks"] == []
    assert "no absolute threshold set (min_accuracy)" in verdict["reasons"]
    assert "no earlier blessed run to compare with (first blessing)" in verdict["reasons"]


@pytest.mark.parametrize(
    ("accuracy", "blessed", "reason"),
    [
        (0.80, True, "accuracy 0.8000 meets min_accuracy 0.8000"),
        (0.79, False, "accuracy 0.7900 is below min_accuracy 0.8000"),
    ],
)
def test_min_accuracy(accuracy, blessed, reason):
    verdict = decide(accuracy=accuracy, min_accuracy=0.80)
    assert verdict["blessed"] is blessed
    assert verdict["moves_latest_pointer"] is blessed
    assert reason in verdict["reasons"]


@pytest.mark.parametrize(("accuracy", "blessed"), [(0.895, True), (0.885, False)])
def test_regression_against_last_blessed(accuracy, blessed):
    verdict = decide(accuracy=accuracy, max_regression=0.01, baseline=BASELINE)
    assert verdict["blessed"] is blessed
    (check,) = verdict["checks"]
    assert check["baseline_date"] == "2026-01-30"
    assert check["threshold"] == pytest.approx(0.89)
    assert verdict["baseline"] == BASELINE


def test_both_checks_must_pass():
    verdict = decide(accuracy=0.95, min_accuracy=0.99, max_regression=0.01, baseline=BASELINE)
    assert not verdict["blessed"]
    assert [c["passed"] for c in verdict["checks"]] == [False, True]


def test_baseline_of_another_dataset_is_not_compared():
    verdict = decide(accuracy=0.1, max_regression=0.01, baseline=BASELINE | {"dataset": "mnist"})
    assert verdict["blessed"] and verdict["checks"] == []
    assert any("used dataset 'mnist'" in r for r in verdict["reasons"])


def test_backfill_is_blessed_without_moving_the_pointer():
    verdict = decide(baseline=BASELINE, date="2026-01-01")
    assert verdict["blessed"] and not verdict["moves_latest_pointer"]
    assert any("backfill" in r for r in verdict["reasons"])


def _pointer(root) -> dict | None:
    path = os.path.join(root, layout.LATEST_POINTER_FILE)
    return atomic.read_json(path) if os.path.exists(path) else None


def _blessing(config) -> dict:
    return atomic.read_json(os.path.join(config.evaluate_dir, layout.BLESSING_FILE))


def test_pointer_moves_only_on_blessing(make_config, run_root):
    rejected = make_config(min_accuracy=0.999)
    metrics = run(rejected)
    assert not metrics["blessed"] and not _blessing(rejected)["blessed"]
    assert _pointer(run_root) is None

    accepted = make_config(min_accuracy=0.1)
    metrics = run(accepted)
    assert _blessing(accepted)["blessed"]
    pointer = _pointer(run_root)
    assert pointer["date"] == DATE
    # Relative to output_root: the runs folder can be moved or mounted elsewhere.
    assert pointer["model_path"] == f"{DATE}/train/{layout.MODEL_FILE}"
    assert pointer["metrics_path"] == f"{DATE}/evaluate/{layout.METRICS_FILE}"
    assert pointer["accuracy"] == metrics["accuracy"]
    assert not [n for n in os.listdir(run_root) if ".tmp-" in n]

    before = pathlib.Path(os.path.join(run_root, layout.LATEST_POINTER_FILE)).read_text()
    run(make_config(min_accuracy=0.999))
    assert pathlib.Path(os.path.join(run_root, layout.LATEST_POINTER_FILE)).read_text() == before


def test_regression_against_the_pointer(make_config, run_root):
    better = {
        "date": "2026-01-30",
        "model_path": "elsewhere/model.keras",
        "accuracy": 0.999,
        "dataset": "fashion_mnist",
    }
    path = os.path.join(run_root, layout.LATEST_POINTER_FILE)
    with open(path, "w") as f:
        json.dump(better, f)
    config = make_config(max_regression=0.01)
    metrics = run(config)
    verdict = _blessing(config)
    assert not metrics["blessed"] and not verdict["blessed"]
    assert verdict["baseline"] == better
    assert "below the last blessed run (2026-01-30: 0.9990)" in " ".join(verdict["reasons"])
    assert atomic.read_json(path) == better
