"""Blessing decisions and the `latest` pointer, which moves only for a blessed run."""

from __future__ import annotations

import os
import pathlib

import pytest

from contract import atomic, layout
from evaluate import blessing, run
from tests.evaluate.conftest import DATE

POINTER = {"date": "2026-01-30", "accuracy": 0.95, "dataset": "fashion_mnist"}
# The last blessed model scored on this run's eval set: 0.90 (it scored 0.95 on its own night).
BASELINE = blessing.Baseline(pointer=POINTER, accuracy=0.90, loss=0.3)


def decide(
    accuracy=0.85,
    min_accuracy=None,
    max_regression=None,
    max_relative_regression=None,
    baseline=None,
    date=DATE,
):
    return blessing.decide(
        date=date,
        accuracy=accuracy,
        thresholds=blessing.Thresholds(min_accuracy, max_regression, max_relative_regression),
        baseline=baseline,
    )


def test_first_run_without_thresholds_is_blessed_and_says_why():
    verdict = decide()
    assert verdict["blessed"] and verdict["moves_latest_pointer"]
    assert verdict["checks"] == [] and verdict["baseline"] is None and not verdict["fallback"]
    assert "no value threshold set (min_accuracy)" in verdict["reasons"]
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
    (check,) = verdict["checks"]
    assert check | {"passed": None} == {
        "name": "min_accuracy",
        "kind": "value",
        "metric": "accuracy",
        "value": accuracy,
        "limit": 0.80,
        "passed": None,
    }
    assert check["passed"] is blessed


# The baseline scores 0.90 on this eval set: 0.89 is exactly one point (and 1.11 %) below it.
@pytest.mark.parametrize(
    ("accuracy", "blessed"), [(0.895, True), (0.89, True), (0.8899, False), (0.95, True)]
)
def test_absolute_change_against_the_baseline_on_this_eval_set(accuracy, blessed):
    verdict = decide(accuracy=accuracy, max_regression=0.01, baseline=BASELINE)
    assert verdict["blessed"] is blessed
    (check,) = verdict["checks"]
    assert check["name"] == "max_regression" and check["kind"] == "change"
    assert check["value"] == pytest.approx(accuracy - 0.90)
    assert check["limit"] == pytest.approx(-0.01)
    assert (check["candidate"], check["baseline"]) == (accuracy, 0.90)
    assert check["passed"] is blessed
    assert verdict["baseline"]["accuracy"] == 0.90
    assert verdict["baseline"]["recorded_accuracy"] == 0.95
    assert verdict["baseline"]["pointer"] == POINTER


@pytest.mark.parametrize(("accuracy", "blessed"), [(0.8910, True), (0.8909, False)])
def test_relative_change_against_the_baseline(accuracy, blessed):
    # 1 % of 0.90 is 0.009: the floor is 0.891.
    verdict = decide(accuracy=accuracy, max_relative_regression=0.01, baseline=BASELINE)
    assert verdict["blessed"] is blessed
    (check,) = verdict["checks"]
    assert check["name"] == "max_relative_regression"
    assert check["value"] == pytest.approx((accuracy - 0.90) / 0.90)
    assert check["limit"] == pytest.approx(-0.01)
    assert check["passed"] is blessed
    verb = "is within" if blessed else "drops more than"
    assert any(f"{verb} max_relative_regression 1.00%" in r for r in verdict["reasons"])


def test_each_threshold_passes_or_fails_on_its_own():
    # 0.885 against 0.90: -1.7 % is within the relative 2 %, -0.015 is not within the
    # absolute 0.01; every check is listed with its own result.
    verdict = decide(
        accuracy=0.885,
        min_accuracy=0.80,
        max_regression=0.01,
        max_relative_regression=0.02,
        baseline=BASELINE,
    )
    assert not verdict["blessed"]
    assert [(c["name"], c["passed"]) for c in verdict["checks"]] == [
        ("min_accuracy", True),
        ("max_regression", False),
        ("max_relative_regression", True),
    ]


def test_unscored_baseline_falls_back_to_the_value_threshold():
    unscored = blessing.Baseline(pointer=POINTER, unscored_reason="it takes inputs of shape [14]")
    verdict = decide(accuracy=0.5, min_accuracy=0.4, max_regression=0.01, baseline=unscored)
    assert verdict["blessed"] and verdict["fallback"]
    assert [c["name"] for c in verdict["checks"]] == ["min_accuracy"]
    assert verdict["baseline"]["scored"] is False
    assert verdict["baseline"]["unscored_reason"] == "it takes inputs of shape [14]"
    assert any(
        "could not be scored on this run's eval set: it takes inputs of shape [14]; judged on "
        "the value threshold only" in r
        for r in verdict["reasons"]
    )


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


def test_a_pointer_date_that_is_no_calendar_date_never_holds_the_pointer_back():
    # As text "20261231" sorts after "2026-12-31" ('1' > '-'), and after every night of 2026.
    odd = blessing.Baseline(pointer={**POINTER, "date": "20261231"}, accuracy=0.90, loss=0.3)
    assert decide(baseline=odd, date="2026-12-31")["moves_latest_pointer"]
    newer = blessing.Baseline(pointer={**POINTER, "date": "2026-12-31"}, accuracy=0.90, loss=0.3)
    verdict = decide(baseline=newer, date="2026-12-30")
    assert verdict["blessed"] and not verdict["moves_latest_pointer"]
