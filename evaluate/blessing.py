"""Blessing: is this model good enough to serve, judged on value and change thresholds.

As TFX's Evaluator does, the candidate is judged against the last blessed model (the one
`<output_root>/latest.json` names) scored on the *same* eval set as the candidate, this run's:
a value threshold (min_accuracy) and two change thresholds against that baseline, one absolute
(max_regression: the accuracy may drop at most this much) and one relative
(max_relative_regression: at most this fraction of the baseline's accuracy).

The two models are scored on the same examples, so the change thresholds are judged on the
paired difference with its uncertainty (evaluate.paired), not on two point estimates: a change
threshold is a non-inferiority margin, met when the lower end of the difference's confidence
interval lies at or above it. A small eval set gives a wide interval, and then only a candidate
that is clearly no worse passes. The verdict also says whether the candidate is better, worse
or not detectably different, with the interval and McNemar's p-value.

When the baseline cannot be scored any more (another input shape, a missing or altered file, a
failed load), the change thresholds are skipped, the candidate is judged on the value threshold
alone and the verdict says so (`baseline.scored` false, `fallback` true). A rule set with no
threshold at all blesses nothing unless `bless_without_thresholds` asks for it (TFMA's
"rubber stamp"), and the verdict records that it did.

The verdict (blessing.json) is written every time and lists each threshold's value, limit and
pass/fail. Only a blessed run moves the pointer (`contract.pointer.write`).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from contract import dates
from evaluate.paired import Comparison
from evaluate.predictions import Predictions

# Accuracies are ratios of counts: a drop of exactly the allowed amount must pass even when
# float subtraction lands a hair below the limit (0.89 - 0.90 < -0.01 in binary).
_ROUNDING = 1e-9


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """What a candidate must reach; None skips a threshold.

    Attributes:
        min_accuracy: accuracy (0-1) the candidate needs (a value threshold).
        max_regression: largest accuracy drop against the baseline, in accuracy (0.01 is one
            percentage point): an absolute change threshold.
        max_relative_regression: largest accuracy drop against the baseline as a fraction of
            the baseline's accuracy (0.01 is 1 % of it): a relative change threshold.
        confidence: the level of the difference's interval the change thresholds are judged on.
        bless_without_thresholds: with no threshold set, bless anyway (recorded as such).
    """

    min_accuracy: float | None = None
    max_regression: float | None = None
    max_relative_regression: float | None = None
    confidence: float = 0.95
    bless_without_thresholds: bool = False

    @property
    def has_change_thresholds(self) -> bool:
        return self.max_regression is not None or self.max_relative_regression is not None

    @property
    def empty(self) -> bool:
        return self.min_accuracy is None and not self.has_change_thresholds


@dataclasses.dataclass(frozen=True)
class Baseline:
    """The last blessed model, scored (or not) on this run's eval set.

    Attributes:
        pointer: the `latest` pointer naming it.
        accuracy: its accuracy on this run's eval set, or None when it could not be scored.
        loss: its loss there, or None.
        unscored_reason: why it could not be scored (None when it was).
        comparison: the candidate against it, example by example (None when not scored).
        predictions: its per-example predictions on this run's eval set (None when not scored).
    """

    pointer: dict[str, Any]
    accuracy: float | None = None
    loss: float | None = None
    unscored_reason: str | None = None
    comparison: Comparison | None = None
    predictions: Predictions | None = None

    @property
    def date(self) -> str:
        return str(self.pointer.get("date", "?"))

    def document(self) -> dict[str, Any]:
        """The baseline as the verdict records it."""
        recorded = self.pointer.get("accuracy")
        return {
            "date": self.date,
            "model_path": self.pointer.get("model_path"),
            "model_sha256": self.pointer.get("model_sha256"),
            "scored": self.accuracy is not None,
            "accuracy": self.accuracy,
            "loss": self.loss,
            "unscored_reason": self.unscored_reason,
            # What it scored on its own night's eval set, for reference only.
            "recorded_accuracy": None if recorded is None else float(recorded),
            "pointer": self.pointer,
        }


def _change_checks(
    accuracy: float, baseline: Baseline, thresholds: Thresholds
) -> tuple[list[dict[str, Any]], list[str]]:
    """The change thresholds' checks and reasons against a scored baseline.

    Each threshold is a non-inferiority margin on the paired difference: it passes when the
    lower end of the difference's interval is at or above it.
    """
    assert baseline.accuracy is not None
    comparison = baseline.comparison
    if comparison is None:
        raise ValueError("a scored baseline needs its paired comparison with the candidate")
    base = baseline.accuracy
    interval = (
        f"{comparison.confidence:.0%} interval [{comparison.lower:+.4f}, {comparison.upper:+.4f}]"
    )
    against = (
        f"accuracy {accuracy:.4f} against {base:.4f} of the last blessed model "
        f"({baseline.date}) on this run's eval set"
    )
    checks: list[dict[str, Any]] = []
    reasons: list[str] = [
        f"against the last blessed model ({baseline.date}): {comparison.summary()}"
    ]
    common = {
        "kind": "change",
        "metric": "accuracy",
        "candidate": accuracy,
        "baseline": base,
        "statistic": "lower end of the paired interval",
    }
    if thresholds.max_regression is None:
        reasons.append("no absolute change threshold set (max_regression)")
    else:
        limit = -thresholds.max_regression
        passed = comparison.lower >= limit - _ROUNDING
        checks.append(
            {
                "name": "max_regression",
                "value": comparison.lower,
                "limit": limit,
                "passed": passed,
                "difference": comparison.difference,
                "interval": [comparison.lower, comparison.upper],
            }
            | common
        )
        verb = "is within" if passed else "drops more than"
        reasons.append(
            f"{against}: change {comparison.difference:+.4f}, {interval}, whose lower end "
            f"{verb} max_regression {thresholds.max_regression:.4f}"
        )
    if thresholds.max_relative_regression is None:
        reasons.append("no relative change threshold set (max_relative_regression)")
    elif base == 0.0:
        reasons.append(
            "the last blessed model scores 0 on this run's eval set: no relative change to "
            "check (max_relative_regression)"
        )
    else:
        lower, upper = comparison.lower / base, comparison.upper / base
        limit = -thresholds.max_relative_regression
        passed = lower >= limit - _ROUNDING
        checks.append(
            {
                "name": "max_relative_regression",
                "value": lower,
                "limit": limit,
                "passed": passed,
                "difference": comparison.difference / base,
                "interval": [lower, upper],
            }
            | common
        )
        verb = "is within" if passed else "drops more than"
        reasons.append(
            f"{against}: relative change {comparison.difference / base:+.2%}, interval "
            f"[{lower:+.2%}, {upper:+.2%}], whose lower end {verb} max_relative_regression "
            f"{thresholds.max_relative_regression:.2%}"
        )
    return checks, reasons


def decide(
    *,
    date: str,
    accuracy: float,
    thresholds: Thresholds,
    baseline: Baseline | None,
    baseline_problem: str | None = None,
) -> dict[str, Any]:
    """Decides whether a run is blessed and says why.

    Args:
        date: this run's date.
        accuracy: the candidate's accuracy on this run's eval set.
        thresholds: the value and change thresholds.
        baseline: the last blessed model scored on the same eval set, or None when no blessed
            run exists yet.
        baseline_problem: why a latest pointer that exists is no baseline (its model and
            metrics gone, say), said instead of "first blessing".

    Returns:
        The verdict: `blessed`; `checks`, one per threshold applied, each with `value`,
        `limit` and `passed`; plain-language `reasons`; the `candidate` and `baseline`
        accuracies; `fallback` (change thresholds were set but the baseline could not be
        scored); and whether the pointer should move to this run.
    """
    checks: list[dict[str, Any]] = []
    reasons: list[str] = []

    if thresholds.min_accuracy is None:
        reasons.append("no value threshold set (min_accuracy)")
    else:
        passed = accuracy >= thresholds.min_accuracy
        checks.append(
            {
                "name": "min_accuracy",
                "kind": "value",
                "metric": "accuracy",
                "value": accuracy,
                "limit": thresholds.min_accuracy,
                "passed": passed,
            }
        )
        verb = "meets" if passed else "is below"
        reasons.append(f"accuracy {accuracy:.4f} {verb} min_accuracy {thresholds.min_accuracy:.4f}")

    fallback = False
    if baseline is None:
        # A pointer that exists but cannot be a baseline is named, never taken for none.
        reasons.append(
            baseline_problem or "no earlier blessed run to compare with (first blessing)"
        )
    elif baseline.accuracy is None:
        fallback = thresholds.has_change_thresholds
        reasons.append(
            f"the last blessed model ({baseline.date}) could not be scored on this run's eval "
            f"set: {baseline.unscored_reason}; judged on the value threshold only"
        )
    elif not thresholds.has_change_thresholds:
        reasons.append(
            f"no change thresholds set (max_regression, max_relative_regression); the last "
            f"blessed model ({baseline.date}) scores {baseline.accuracy:.4f} on this run's eval set"
        )
        if baseline.comparison is not None:
            reasons.append(
                f"against the last blessed model ({baseline.date}): {baseline.comparison.summary()}"
            )
    else:
        change_checks, change_reasons = _change_checks(accuracy, baseline, thresholds)
        checks += change_checks
        reasons += change_reasons

    rubber_stamp = thresholds.empty and thresholds.bless_without_thresholds
    if thresholds.empty:
        reasons.append(
            "blessed without thresholds: bless_without_thresholds is set"
            if rubber_stamp
            else "no threshold set (min_accuracy, max_regression, max_relative_regression): an "
            "empty rule set blesses nothing unless bless_without_thresholds is set"
        )
    blessed = all(c["passed"] for c in checks) and (not thresholds.empty or rubber_stamp)
    move_pointer = blessed
    if blessed and baseline is not None and dates.is_later(baseline.pointer.get("date"), date):
        move_pointer = False
        reasons.append(
            f"blessed, but the latest pointer stays on the newer run {baseline.date} "
            "(this is a backfill of an older date)"
        )
    return {
        "blessed": blessed,
        "checks": checks,
        "reasons": reasons,
        "candidate": {"date": date, "accuracy": accuracy},
        "baseline": None if baseline is None else baseline.document(),
        "fallback": fallback,
        "comparison": (
            None
            if baseline is None or baseline.comparison is None
            else baseline.comparison.document()
        ),
        "confidence": thresholds.confidence,
        "bless_without_thresholds": rubber_stamp,
        "moves_latest_pointer": move_pointer,
        "decided_utc": datetime.datetime.now(datetime.UTC).isoformat(),
    }
