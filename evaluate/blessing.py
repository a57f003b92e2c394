"""Blessing: is this model good enough to serve, judged against thresholds and the last blessed run.

The last blessed run is whatever `<output_root>/latest.json` points at ("last night's model").
Only a blessed run moves that pointer (`contract.pointer.write`, write-temp-then-rename), so a
reader sees either the old pointer or the new one.
"""

from __future__ import annotations

import datetime
from typing import Any


def decide(
    *,
    date: str,
    dataset: str,
    accuracy: float,
    min_accuracy: float | None,
    max_regression: float | None,
    baseline: dict[str, Any] | None,
) -> dict[str, Any]:
    """Decides whether a run is blessed and says why.

    Args:
        date: this run's date.
        dataset: this run's dataset name; a baseline on another dataset is not comparable.
        accuracy: this run's eval accuracy.
        min_accuracy: absolute threshold, or None for none.
        max_regression: allowed accuracy drop against the baseline (fraction), or None.
        baseline: the current `latest` pointer, or None.

    Returns:
        The blessing document: `blessed`, the `checks` made, plain-language `reasons`, the
        baseline used and whether the pointer should move to this run.
    """
    checks: list[dict[str, Any]] = []
    reasons: list[str] = []

    if min_accuracy is None:
        reasons.append("no absolute threshold set (min_accuracy)")
    else:
        passed = accuracy >= min_accuracy
        checks.append(
            {"name": "min_accuracy", "passed": passed, "value": accuracy, "threshold": min_accuracy}
        )
        verb = "meets" if passed else "is below"
        reasons.append(f"accuracy {accuracy:.4f} {verb} min_accuracy {min_accuracy:.4f}")

    if baseline is None:
        reasons.append("no earlier blessed run to compare with (first blessing)")
    elif baseline.get("dataset") != dataset:
        reasons.append(
            f"the last blessed run ({baseline.get('date')}) used dataset "
            f"{baseline.get('dataset')!r}, not {dataset!r}: not compared"
        )
    elif max_regression is None:
        reasons.append("no regression limit set (max_regression)")
    else:
        floor = float(baseline["accuracy"]) - max_regression
        passed = accuracy >= floor
        checks.append(
            {
                "name": "max_regression",
                "passed": passed,
                "value": accuracy,
                "baseline_accuracy": float(baseline["accuracy"]),
                "baseline_date": baseline["date"],
                "max_regression": max_regression,
                "threshold": floor,
            }
        )
        verb = "within" if passed else "more than"
        reasons.append(
            f"accuracy {accuracy:.4f} is {verb} {max_regression:.4f} below the last blessed run "
            f"({baseline['date']}: {float(baseline['accuracy']):.4f})"
        )

    blessed = all(c["passed"] for c in checks)
    move_pointer = blessed
    if blessed and baseline is not None and str(baseline.get("date", "")) > date:
        move_pointer = False
        reasons.append(
            f"blessed, but the latest pointer stays on the newer run {baseline['date']} "
            "(this is a backfill of an older date)"
        )
    return {
        "blessed": blessed,
        "checks": checks,
        "reasons": reasons,
        "baseline": baseline,
        "moves_latest_pointer": move_pointer,
        "decided_utc": datetime.datetime.now(datetime.UTC).isoformat(),
    }
