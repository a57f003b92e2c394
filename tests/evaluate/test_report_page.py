"""report.html: the report as one self-contained page, pictures embedded, text escaped."""

from __future__ import annotations

import base64
import os
import pathlib

from contract import atomic, layout
from evaluate import report, report_page, run
from tests.evaluate import pages

DATA_URI = "data:image/png;base64,"


def test_report_page_embeds_its_pictures_and_needs_no_other_file(make_config):
    config = make_config(min_accuracy=0.999)
    metrics = run(config)
    out = config.evaluate_dir
    text = pathlib.Path(os.path.join(out, report_page.REPORT_HTML_FILE)).read_text()

    images = pages.tags(text, "img")
    assert [i["alt"] for i in images] == [
        "confusion matrix",
        "reliability diagram",
        "training curves",
    ]
    names = (report.CONFUSION_MATRIX_PNG, report.RELIABILITY_PNG, report.TRAINING_CURVES_PNG)
    for image, name in zip(images, names, strict=True):
        assert image["src"].startswith(DATA_URI)
        embedded = base64.b64decode(image["src"][len(DATA_URI) :])
        assert embedded == pathlib.Path(os.path.join(out, name)).read_bytes()
    # Nothing else is loaded: no scripts, stylesheets or frames; the one link goes back to
    # the trend page.
    for tag in ("script", "link", "iframe", "object"):
        assert pages.tags(text, tag) == []
    assert [a["href"] for a in pages.tags(text, "a")] == [report_page.TREND_PAGE_FROM_REPORT]
    assert f"<td>{metrics['accuracy']:.4f}</td>" in text
    assert "not blessed" in text and "is below min_accuracy 0.9990" in text
    assert "<td>Ankle boot</td>" in text
    # Not a dataset of daily drops: no accuracy by day (tests/evaluate/test_accuracy_by_day.py).
    assert metrics["accuracy_by_day"] is None and 'id="by-day"' not in text


def test_report_page_escapes_text(make_config):
    config = make_config()
    run(config)
    metrics = atomic.read_json(os.path.join(config.evaluate_dir, layout.METRICS_FILE))
    metrics["per_class"] = {"<T-shirt & top>": next(iter(metrics["per_class"].values()))}
    verdict = {
        "blessed": False,
        "reasons": ["<script>alert(1)</script>"],
        "baseline": {"date": "<b>", "scored": False, "unscored_reason": "<i>"},
    }
    push = {"pushed": False, "status": "not blessed", "reason": "<u>"}
    pictures = {report.CONFUSION_MATRIX_PNG: b"a", report.TRAINING_CURVES_PNG: b"b"}
    text = report_page.render(metrics, verdict, push, pictures)
    assert "<script>" not in text and "<T-shirt" not in text
    assert "<b>" not in text and "<i>" not in text and "<u>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "<td>&lt;T-shirt &amp; top&gt;</td>" in text
