"""The report as one self-contained HTML page, report.html beside report.md (pictures embedded).

Everything the page shows comes from the metrics and blessing documents; the pictures are
embedded as base64 `data:` URIs, so the page opens the same when mailed or copied alone.
"""

from __future__ import annotations

import base64
import html
import string
from typing import Any

from evaluate import report

REPORT_HTML_FILE = "report.html"
# The trend page sits at the output root, two levels above `<date>/evaluate/report.html`.
TREND_PAGE_FROM_REPORT = "../../index.html"

_PAGE = string.Template(
    """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Evaluation of run $date</title>
<style>
body { font-family: sans-serif; margin: 2em; max-width: 70em; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.blessed { color: #1a7f37; } .not-blessed { color: #cf222e; }
img { max-width: 100%; }
</style>
</head>
<body>
<p><a href="$trend_page">All nights</a></p>
<h1>Evaluation of run $date</h1>
<p>Model <code>$model_path</code> (sha256 <code>$model_sha</code>…), dataset $dataset,
split <code>$split</code> ($num_examples examples, read once in full).</p>
<table id="metrics">
<tr><th>metric</th><th>value</th></tr>
$metric_rows
</table>
$by_day
<h2>Blessing: <span class="$verdict_class">$verdict</span></h2>
<p id="baseline">$baseline</p>
<p id="comparison">$comparison</p>
<table id="checks">
<tr><th>threshold</th><th>value</th><th>limit</th><th>result</th></tr>
$check_rows
</table>
<ul id="reasons">
$reasons
</ul>
<h2>Serving</h2>
<p id="push">$push</p>
<h2>Per class</h2>
<table id="per-class">
<tr><th>class</th><th>precision</th><th>recall</th><th>F1</th><th>support</th></tr>
$class_rows
</table>
<h2>Confusion matrix</h2>
<img alt="confusion matrix" src="$confusion_matrix">
<h2>Calibration</h2>
<p id="calibration">$calibration</p>
$reliability
<h2>Training</h2>
<p>$training</p>
<img alt="training curves" src="$training_curves">
</body>
</html>
"""
)


def data_uri(png: bytes) -> str:
    """A PNG as a `data:` URI, for an `<img src>` that needs no other file."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _cells(values: list[str]) -> str:
    return "<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in values) + "</tr>"


def _day_section(metrics: dict[str, Any]) -> str:
    """The table of accuracy per drop day, or "" when the eval examples carry no day."""
    rows = report.day_rows(metrics)
    if not rows:
        return ""
    return "\n".join(
        [
            "<h2>Accuracy by drop day</h2>",
            "<p>The eval examples grouped by the day of the drop they came from.</p>",
            '<table id="by-day">',
            "<tr><th>day</th><th>examples</th><th>accuracy</th></tr>",
            *[_cells(list(row)) for row in rows],
            "</table>",
        ]
    )


def render(
    metrics: dict[str, Any],
    blessing: dict[str, Any],
    push: dict[str, Any],
    pictures: dict[str, bytes],
) -> str:
    """Renders one evaluation as a self-contained HTML page.

    Args:
        metrics: the metrics document (as written to metrics.json).
        blessing: the blessing document (as written to blessing.json).
        push: the push document (as written to push.json).
        pictures: PNG bytes by file name (report.CONFUSION_MATRIX_PNG, TRAINING_CURVES_PNG,
            RELIABILITY_PNG).

    Returns:
        The page; every text from the documents is HTML-escaped.
    """
    model = metrics["model"]
    dataset = metrics["dataset"]
    training = model.get("training", {})
    macro = metrics["macro_avg"]
    metric_rows = [
        ("accuracy", metrics["accuracy"]),
        ("loss", metrics["loss"]),
        ("macro precision", macro["precision"]),
        ("macro recall", macro["recall"]),
        ("macro F1", macro["f1"]),
    ]
    blessed = bool(blessing["blessed"])
    return _PAGE.substitute(
        date=html.escape(str(metrics["date"])),
        trend_page=TREND_PAGE_FROM_REPORT,
        model_path=html.escape(str(model["path"])),
        model_sha=html.escape(str(model["sha256"])[:16]),
        dataset=html.escape(f"{dataset['name']} {dataset['version']}"),
        split=html.escape(str(dataset["split"])),
        num_examples=f"{metrics['num_examples']:,}",
        metric_rows="\n".join(_cells([name, f"{value:.4f}"]) for name, value in metric_rows),
        by_day=_day_section(metrics),
        verdict_class="blessed" if blessed else "not-blessed",
        verdict="blessed" if blessed else "not blessed",
        baseline=html.escape(report.baseline_line(blessing)),
        comparison=html.escape(report.comparison_line(blessing).replace("**", "")),
        calibration=html.escape(report.calibration_line(metrics)),
        reliability=(
            f'<img alt="reliability diagram" src="{data_uri(pictures[report.RELIABILITY_PNG])}">'
            if report.RELIABILITY_PNG in pictures
            else ""
        ),
        check_rows="\n".join(_cells(list(row)) for row in report.check_rows(blessing)),
        push=html.escape(report.push_line(push)),
        reasons="\n".join(f"<li>{html.escape(r)}</li>" for r in blessing["reasons"]),
        class_rows="\n".join(
            _cells(
                [
                    name,
                    f"{c['precision']:.4f}",
                    f"{c['recall']:.4f}",
                    f"{c['f1']:.4f}",
                    str(c["support"]),
                ]
            )
            for name, c in metrics["per_class"].items()
        ),
        confusion_matrix=data_uri(pictures[report.CONFUSION_MATRIX_PNG]),
        training=html.escape(
            f"{training.get('epochs_completed', '?')} epochs "
            f"(best epoch {training.get('best_epoch', '?')}, "
            f"stopped early: {training.get('stopped_early', '?')}), "
            f"{training.get('num_workers', '?')} workers, "
            f"global batch {training.get('global_batch_size', '?')}, "
            f"model {training.get('model', '?')}."
        ),
        training_curves=data_uri(pictures[report.TRAINING_CURVES_PNG]),
    )
