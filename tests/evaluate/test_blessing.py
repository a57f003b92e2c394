"""Blessing decisions and the `latest` pointer, which moves only for a blessed run."""

from __future__ import annotations

import os

import numpy as np
import pytest

from contract import atomic, layout
from evaluate import blessing, paired, run
from tests.evaluate.conftest import DATE

POINTER = {"date": "2026-01-30", "accuracy": 0.95, "dataset": "fashion_mnist"}
EXAMPLES = 10000


def scored_baseline(candidate_only: int, baseline_only: int, pointer=POINTER) -> blessing.Baseline:
    """The last blessed model scoring 0.90 on this run's 10,000 eval examples (it scored 0.95
    on its own night), and the candidate's paired comparison with it: the candidate gets
    `candidate_only` examples right that the baseline misses, and misses `baseline_only` that
    it gets right."""
    baseline = np.zeros(EXAMPLES, bool)
    baseline[:9000] = True
    candidate = baseline.copy()
    candidate[:baseline_only] = False
    candidate[9000 : 9000 + candidate_only] = True
    comparison = paired.compare(candidate, baseline, confidence=0.95)
    return blessing.Baseline(pointer=pointer, accuracy=0.90, loss=0.3, comparison=comparison)


BASELINE = scored_baseline(0, 0)


def decide(
    accuracy=0.85,
    min_accuracy=None,
    max_regression=None,
    max_relative_regression=None,
    baseline=None,
    date=DATE,
    bless_without_thresholds=True,
):
    return blessing.decide(
        date=date,
        accuracy=accuracy,
        thresholds=blessing.Thresholds(
            min_accuracy,
            max_regression,
            max_relative_regression,
            bless_without_thresholds=bless_without_thresholds,
        ),
        baseline=baseline,
    )


def test_first_run_without_thresholds_is_blessed_only_when_asked_and_says_why():
    verdict = decide()
    assert verdict["blessed"] and verdict["moves_latest_pointer"]
    assert verdict["bless_without_thresholds"]
    assert verdict["checks"] == [] and verdict["baseline"] is None and not verdict["fallback"]
    assert "no value threshold set (min_accuracy)" in verdict["reasons"]
    assert "no earlier blessed run to compare with (first blessing)" in verdict["reasons"]
    assert "blessed without thresholds: bless_without_thresholds is set" in verdict["reasons"]


def test_an_empty_rule_set_blesses_nothing_unless_asked():
    verdict = decide(accuracy=0.99, bless_without_thresholds=False)
    assert not verdict["blessed"] and not verdict["moves_latest_pointer"]
    assert not verdict["bless_without_thresholds"]
    assert any("an empty rule set blesses nothing" in r for r in verdict["reasons"])


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


# The baseline scores 0.90 on 10,000 examples. (candidate_only, baseline_only): the candidate
# gains and loses that many examples against it.
@pytest.mark.parametrize(
    ("gained", "lost", "blessed"),
    [
        (0, 0, True),  # the same predictions: the interval is [0, 0]
        (0, 50, True),  # half a point worse: the interval's lower end is about -0.0064
        (0, 100, False),  # exactly one point worse: the point rule passes it, the interval not
        (150, 250, False),  # one point worse with churn: the lower end is about -0.014
        (200, 100, True),  # better: the interval lies above 0
    ],
)
def test_absolute_change_is_judged_at_the_lower_end_of_the_paired_interval(gained, lost, blessed):
    baseline = scored_baseline(gained, lost)
    comparison = baseline.comparison
    accuracy = 0.90 + (gained - lost) / EXAMPLES
    verdict = decide(accuracy=accuracy, max_regression=0.01, baseline=baseline)
    assert verdict["blessed"] is blessed
    (check,) = verdict["checks"]
    assert check["name"] == "max_regression" and check["kind"] == "change"
    assert check["value"] == comparison.lower
    assert check["difference"] == pytest.approx(accuracy - 0.90)
    assert check["interval"] == [comparison.lower, comparison.upper]
    assert check["limit"] == pytest.approx(-0.01)
    assert (check["candidate"], check["baseline"]) == (accuracy, 0.90)
    assert check["passed"] is blessed is (comparison.lower >= -0.01)
    assert verdict["comparison"] == comparison.document()
    assert verdict["baseline"]["accuracy"] == 0.90
    assert verdict["baseline"]["recorded_accuracy"] == 0.95
    assert verdict["baseline"]["pointer"] == POINTER
    assert any(comparison.summary() in r for r in verdict["reasons"])


@pytest.mark.parametrize(
    ("gained", "lost", "verdict_word"),
    [(300, 100, "better"), (100, 300, "worse"), (105, 100, "no detectable difference")],
)
def test_the_verdict_names_the_direction_with_interval_and_p_value(gained, lost, verdict_word):
    verdict = decide(
        accuracy=0.90 + (gained - lost) / EXAMPLES,
        max_regression=0.05,
        baseline=scored_baseline(gained, lost),
    )
    comparison = verdict["comparison"]
    assert comparison["verdict"] == verdict_word
    assert comparison["candidate_only"] == gained and comparison["baseline_only"] == lost
    assert 0.0 <= comparison["p_value"] <= 1.0
    assert any(r.endswith("only the baseline)") and verdict_word in r for r in verdict["reasons"])


@pytest.mark.parametrize(("lost", "blessed"), [(40, True), (120, False)])
def test_relative_change_against_the_baseline(lost, blessed):
    # 1 % of 0.90 is 0.009: the interval's lower end, as a fraction of 0.90, must be above -1 %.
    baseline = scored_baseline(0, lost)
    verdict = decide(
        accuracy=0.90 - lost / EXAMPLES, max_relative_regression=0.01, baseline=baseline
    )
    assert verdict["blessed"] is blessed
    (check,) = verdict["checks"]
    assert check["name"] == "max_relative_regression"
    assert check["value"] == pytest.approx(baseline.comparison.lower / 0.90)
    assert check["limit"] == pytest.approx(-0.01)
    assert check["passed"] is blessed
    verb = "is within" if blessed else "drops more than"
    assert any(f"{verb} max_relative_regression 1.00%" in r for r in verdict["reasons"])


def test_each_threshold_passes_or_fails_on_its_own():
    # 150 examples lost of 10,000 against 0.90: the lower end (about -0.018) is within the
    # relative 3 % (-0.027) but not within the absolute 0.01; every check is listed.
    verdict = decide(
        accuracy=0.885,
        min_accuracy=0.80,
        max_regression=0.01,
        max_relative_regression=0.03,
        baseline=scored_baseline(0, 150),
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


@pytest.mark.usefixtures("quick_pictures")  # the pictures are checked in test_stage.py
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

    # A re-evaluation that rejects the model the pointer names takes the pointer back: with no
    # earlier blessed night, to nothing (tests/evaluate/test_served.py has the other cases).
    rejected_again = make_config(min_accuracy=0.999)
    run(rejected_again)
    assert _pointer(run_root) is None
    assert any(
        "no earlier blessed night is left" in r for r in _blessing(rejected_again)["reasons"]
    )


def test_a_pointer_date_that_is_no_calendar_date_never_holds_the_pointer_back():
    # As text "20261231" sorts after "2026-12-31" ('1' > '-'), and after every night of 2026.
    odd = scored_baseline(0, 0, pointer={**POINTER, "date": "20261231"})
    assert decide(baseline=odd, date="2026-12-31")["moves_latest_pointer"]
    newer = scored_baseline(0, 0, pointer={**POINTER, "date": "2026-12-31"})
    verdict = decide(baseline=newer, date="2026-12-30")
    assert verdict["blessed"] and not verdict["moves_latest_pointer"]
