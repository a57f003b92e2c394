"""The human-readable report: report.md beside the pictures, with the numbers and the verdict."""

from __future__ import annotations

from typing import Any

CONFUSION_MATRIX_PNG = "confusion_matrix.png"
TRAINING_CURVES_PNG = "training_curves.png"
REPORT_FILE = "report.md"


def render(metrics: dict[str, Any], blessing: dict[str, Any]) -> str:
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
        f"## Blessing: {verdict}",
        "",
        *[f"- {reason}" for reason in blessing["reasons"]],
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
