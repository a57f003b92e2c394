"""The human-readable report: report.md beside the pictures, with the numbers and the verdict."""

from __future__ import annotations

from typing import Any

CONFUSION_MATRIX_PNG = "confusion_matrix.png"
TRAINING_CURVES_PNG = "training_curves.png"
RELIABILITY_PNG = "reliability.png"
REPORT_FILE = "report.md"
# What went to serving (evaluate.serving), written every time, pushed or not.
PUSH_FILE = "push.json"


def check_rows(blessing: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(threshold, value, limit, result) of each check the verdict made, as text."""
    rows = []
    for check in blessing.get("checks", []):
        relative = check["name"] == "max_relative_regression"
        fmt = "{:+.2%}" if relative else ("{:+.4f}" if check.get("kind") == "change" else "{:.4f}")
        rows.append(
            (
                str(check["name"]),
                fmt.format(check["value"]),
                (">= " + fmt).format(check["limit"]),
                "pass" if check["passed"] else "FAIL",
            )
        )
    return rows


def day_rows(metrics: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(day, examples, accuracy) of each drop day of the eval split, as text; [] when its
    examples carry no day."""
    return [
        (row["day"] or "no day", f"{row['num_examples']:,}", f"{row['accuracy']:.4f}")
        for row in metrics.get("accuracy_by_day") or []
    ]


def day_table(metrics: dict[str, Any]) -> list[str]:
    """The Markdown section of the accuracy per drop day, or no lines without days."""
    rows = day_rows(metrics)
    if not rows:
        return []
    return [
        "## Accuracy by drop day",
        "",
        "The eval examples grouped by the day of the drop they came from.",
        "",
        "| day | examples | accuracy |",
        "|---|---|---|",
        *[f"| {' | '.join(row)} |" for row in rows],
        "",
    ]


def baseline_line(blessing: dict[str, Any]) -> str:
    """One sentence on the candidate against the last blessed model on the same eval set."""
    base = blessing.get("baseline")
    candidate = blessing.get("candidate", {}).get("accuracy")
    if not base:
        return "No earlier blessed model: nothing to compare with."
    if not base.get("scored"):
        return (
            f"The last blessed model ({base['date']}) could not be scored on this eval set "
            f"({base.get('unscored_reason')}): judged on the value threshold only."
        )
    return (
        f"On this eval set: candidate accuracy {candidate:.4f}, last blessed model "
        f"({base['date']}) {base['accuracy']:.4f}."
    )


def comparison_line(blessing: dict[str, Any]) -> str:
    """One sentence on the paired comparison with the last blessed model, or "" without one."""
    comparison = blessing.get("comparison")
    if not comparison:
        return ""
    return (
        f"Example by example on the same {comparison['num_examples']:,} examples: "
        f"**{comparison['verdict']}**, accuracy change {comparison['difference']:+.4f} with a "
        f"{comparison['confidence']:.0%} paired bootstrap interval of "
        f"[{comparison['lower']:+.4f}, {comparison['upper']:+.4f}] "
        f"({comparison['resamples']:,} resamples); McNemar's exact test p = "
        f"{comparison['p_value']:.3g} ({comparison['candidate_only']} examples only the "
        f"candidate gets right, {comparison['baseline_only']} only the baseline). The change "
        "thresholds are judged at the interval's lower end."
    )


def calibration_line(metrics: dict[str, Any]) -> str:
    """One sentence on calibration: the expected calibration error and its bins."""
    calibration = metrics.get("calibration")
    if not calibration:
        return "No calibration figures."
    return (
        f"Expected calibration error {calibration['ece']:.4f} over {calibration['bins']} "
        "equal-width bins of the top-class probability: the mean gap, weighted by examples, "
        "between a bin's accuracy and its mean confidence."
    )


def push_line(push: dict[str, Any]) -> str:
    """One sentence on what went to serving."""
    if not push.get("pushed"):
        return f"Not pushed: {push.get('reason', push.get('status'))}."
    verification = push.get("verification") or {}
    server = verification.get("model_server") or {}
    checked = (
        f"loaded back and checked on {verification['examples']} eval examples through both "
        f"signatures (within {verification['tolerance']:g} of the Keras model)"
        if verification
        else "checked when it was first pushed"
    )
    served = (
        "; tensorflow_model_server loaded and answered it too"
        if server.get("ran")
        else f"; {server['reason']}"
        if server.get("reason")
        else ""
    )
    return (
        f"Version {push['version']} of model {push['model_name']} ({push['status']}): "
        f"`{push['path']}`, signatures {', '.join(push['signatures'])}; {checked}{served}."
    )


def render(metrics: dict[str, Any], blessing: dict[str, Any], push: dict[str, Any]) -> str:
    """Renders the Markdown report of one evaluation."""
    model = metrics["model"]
    dataset = metrics["dataset"]
    training = model.get("training", {})
    verdict = "**blessed**" if blessing["blessed"] else "**not blessed**"
    lines = [
        f"# Evaluation of run {metrics['date']}",
        "",
        f"Model `{model['path']}` (sha256 `{model['sha256'][:16]}…`), "
        f"dataset {dataset['name']} {dataset['version']}, split `{dataset['split']}` "
        f"({metrics['num_examples']:,} examples, read once in full).",
        "",
        "| metric | value |",
        "|---|---|",
        f"| accuracy | {metrics['accuracy']:.4f} |",
        f"| loss | {metrics['loss']:.4f} |",
        f"| macro precision | {metrics['macro_avg']['precision']:.4f} |",
        f"| macro recall | {metrics['macro_avg']['recall']:.4f} |",
        f"| macro F1 | {metrics['macro_avg']['f1']:.4f} |",
        "",
        *day_table(metrics),
        f"## Blessing: {verdict}",
        "",
        baseline_line(blessing),
        "",
        comparison_line(blessing),
        "",
        "| threshold | value | limit | result |",
        "|---|---|---|---|",
        *[f"| {' | '.join(row)} |" for row in check_rows(blessing)],
        "",
        *[f"- {reason}" for reason in blessing["reasons"]],
        "",
        "## Serving",
        "",
        push_line(push),
        "",
        "## Per class",
        "",
        "| class | precision | recall | F1 | support |",
        "|---|---|---|---|---|",
        *[
            f"| {name} | {c['precision']:.4f} | {c['recall']:.4f} | {c['f1']:.4f} "
            f"| {c['support']} |"
            for name, c in metrics["per_class"].items()
        ],
        "",
        "## Confusion matrix",
        "",
        f"![confusion matrix]({CONFUSION_MATRIX_PNG})",
        "",
        "## Calibration",
        "",
        calibration_line(metrics),
        "",
        f"![reliability diagram]({RELIABILITY_PNG})",
        "",
        "## Training",
        "",
        f"{training.get('epochs_completed', '?')} epochs "
        f"(best epoch {training.get('best_epoch', '?')}, "
        f"stopped early: {training.get('stopped_early', '?')}), "
        f"{training.get('num_workers', '?')} workers, "
        f"global batch {training.get('global_batch_size', '?')}, "
        f"model `{training.get('model', '?')}`.",
        "",
        f"![training curves]({TRAINING_CURVES_PNG})",
        "",
    ]
    return "\n".join(lines)
