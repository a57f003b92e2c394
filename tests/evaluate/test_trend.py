"""The nightly trend page: one row per current evaluation, by date, escaped, relative links."""

from __future__ import annotations

import datetime
import os
import pathlib
import re
import subprocess

import pytest

from contract import atomic, layout, pointer
from evaluate import report, report_page, run, trend
from pipeline import supersede
from tests.evaluate import pages
from tests.evaluate.conftest import DATE
from tests.factories import PROJECT_ROOT
from tests.tensorflow_probe import NOT_LOADED_LINE, probe_argv

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_night(
    root: pathlib.Path,
    date: str,
    *,
    accuracy: float,
    blessed: bool = True,
    reasons: tuple[str, ...] = ("no absolute threshold set (min_accuracy)",),
    with_metrics: bool = True,
) -> None:
    """Leaves a night's train and evaluate files as the stages would (numbers made up)."""
    train_dir = layout.train_dir(str(root), date)
    evaluate_dir = layout.evaluate_dir(str(root), date)
    os.makedirs(train_dir)
    os.makedirs(evaluate_dir)
    training = {"epochs_completed": 3, "num_workers": 2}
    history = {"history": {}, "wall_time_seconds": 287.4} | training
    atomic.write_json_atomic(layout.join(train_dir, layout.HISTORY_FILE), history)
    for name in (report.CONFUSION_MATRIX_PNG, report.TRAINING_CURVES_PNG):
        atomic.write_bytes_atomic(layout.join(evaluate_dir, name), PNG_MAGIC)
    atomic.write_bytes_atomic(layout.join(evaluate_dir, report_page.REPORT_HTML_FILE), b"<p>")
    verdict = {"blessed": blessed, "reasons": list(reasons)}
    atomic.write_json_atomic(layout.join(evaluate_dir, layout.BLESSING_FILE), verdict)
    if with_metrics:
        metrics = {
            "date": date,
            "accuracy": accuracy,
            "loss": 1 - accuracy,
            "blessed": blessed,
            "model": {"training": training},
        }
        atomic.write_json_atomic(layout.join(evaluate_dir, layout.METRICS_FILE), metrics)


def page(root: pathlib.Path) -> str:
    return (root / trend.INDEX_FILE).read_text()


def test_backfilled_nights_are_rows_in_date_order(tmp_path):
    for date, accuracy in (("2026-01-03", 0.83), ("2026-01-01", 0.81), ("2026-01-02", 0.82)):
        write_night(tmp_path, date, accuracy=accuracy, blessed=date != "2026-01-02")
        trend.update_page(str(tmp_path))

    nights = trend.read_nights(str(tmp_path))
    assert [n.date for n in nights] == ["2026-01-01", "2026-01-02", "2026-01-03"]
    assert [n.accuracy for n in nights] == [0.81, 0.82, 0.83]
    assert [n.blessed for n in nights] == [True, False, True]
    assert (nights[0].training_seconds, nights[0].epochs, nights[0].num_workers) == (287.4, 3, 2)
    text = page(tmp_path)
    assert pages.row_ids(text) == ["night-2026-01-01", "night-2026-01-02", "night-2026-01-03"]
    assert ">4m47s</td>" in text
    assert (tmp_path / trend.TREND_PNG).read_bytes()[:8] == PNG_MAGIC
    assert not [name for name in os.listdir(tmp_path) if ".tmp-" in name]


def test_unfinished_evaluations_and_other_folders_are_not_rows(tmp_path):
    write_night(tmp_path, "2026-01-01", accuracy=0.8)
    write_night(tmp_path, "2026-01-02", accuracy=0.8, with_metrics=False)
    (tmp_path / "luigid").mkdir()
    (tmp_path / "2026-01-03").mkdir()
    trend.update_page(str(tmp_path))
    assert pages.row_ids(page(tmp_path)) == ["night-2026-01-01"]


def test_links_are_relative_and_lead_to_the_nights_files(tmp_path):
    write_night(tmp_path, "2026-01-01", accuracy=0.8)
    trend.update_page(str(tmp_path))
    hrefs = [a["href"] for a in pages.tags(page(tmp_path), "a")]
    assert hrefs == [
        "2026-01-01/evaluate/report.html",
        "2026-01-01/evaluate/metrics.json",
        "2026-01-01/evaluate/blessing.json",
        "2026-01-01/evaluate/confusion_matrix.png",
        "2026-01-01/evaluate/training_curves.png",
    ]
    assert all((tmp_path / href).is_file() for href in hrefs)
    (image,) = pages.tags(page(tmp_path), "img")
    assert image["src"] == trend.TREND_PNG


def test_a_superseded_evaluation_is_not_shown_as_current(tmp_path):
    write_night(tmp_path, "2026-01-01", accuracy=0.8)
    write_night(tmp_path, "2026-01-02", accuracy=0.6125)
    # The pointer names the evaluation that is about to be superseded.
    night = layout.run_dir(str(tmp_path), "2026-01-02")
    atomic.write_json_atomic(
        pointer.pointer_path(str(tmp_path)),
        {
            "date": "2026-01-02",
            "model_path": layout.join(night, "train", layout.MODEL_FILE),
            "metrics_path": layout.join(night, "evaluate", layout.METRICS_FILE),
        },
    )
    trend.update_page(str(tmp_path))
    assert "0.6125" in page(tmp_path) and 'class="latest"' in page(tmp_path)

    now = datetime.datetime(2026, 1, 3, tzinfo=datetime.UTC)
    supersede.supersede(str(tmp_path), "2026-01-02", "evaluate", now=now)
    trend.update_page(str(tmp_path))
    assert pages.row_ids(page(tmp_path)) == ["night-2026-01-01"]
    assert "0.6125" not in page(tmp_path)

    write_night_evaluation_again(tmp_path, "2026-01-02", accuracy=0.7375)
    trend.update_page(str(tmp_path))
    text = page(tmp_path)
    assert pages.row_ids(text) == ["night-2026-01-01", "night-2026-01-02"]
    assert "0.7375" in text and "0.6125" not in text
    # The pointer still names the superseded evaluation: no current row is marked latest.
    assert 'class="latest"' not in text


def write_night_evaluation_again(root: pathlib.Path, date: str, accuracy: float) -> None:
    """A forced rerun's evaluation: the night's train files stay, evaluate/ is new."""
    evaluate_dir = layout.evaluate_dir(str(root), date)
    os.makedirs(evaluate_dir)
    atomic.write_json_atomic(
        layout.join(evaluate_dir, layout.METRICS_FILE),
        {"date": date, "accuracy": accuracy, "loss": 1 - accuracy},
    )


def test_text_from_the_files_is_escaped(tmp_path):
    hostile = "<script>alert('x')</script> & <b>bold</b>"
    write_night(tmp_path, "2026-01-01", accuracy=0.8, blessed=False, reasons=(hostile,))
    trend.update_page(str(tmp_path))
    text = page(tmp_path)
    assert "<script>" not in text and "<b>bold" not in text
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in text


def test_an_unreadable_night_is_left_out_not_fatal(tmp_path, caplog):
    write_night(tmp_path, "2026-01-01", accuracy=0.8)
    write_night(tmp_path, "2026-01-02", accuracy=0.8)
    metrics = layout.join(layout.evaluate_dir(str(tmp_path), "2026-01-02"), layout.METRICS_FILE)
    pathlib.Path(metrics).write_text("{not json")
    trend.update_page(str(tmp_path))
    assert pages.row_ids(page(tmp_path)) == ["night-2026-01-01"]
    assert "leaving out 2026-01-02" in caplog.text


@pytest.mark.parametrize(
    ("seconds", "shown"), [(None, "?"), (4.4, "4s"), (287.4, "4m47s"), (7322, "2h02m")]
)
def test_training_time_is_readable(seconds, shown):
    assert trend._duration(seconds) == shown


def _cells(text: str, date: str) -> list[str]:
    """The text of each cell of a night's row."""
    row = text[text.index(f'<tr id="night-{date}">') :]
    row = row[: row.index("</tr>")]
    return [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]


def test_each_night_shows_its_baseline_on_the_same_eval_set_and_its_pushed_version(tmp_path):
    write_night(tmp_path, "2026-01-01", accuracy=0.8)
    write_night(tmp_path, "2026-01-02", accuracy=0.85, blessed=False)
    write_night(tmp_path, "2026-01-03", accuracy=0.9)
    evaluate = {d: tmp_path / d / "evaluate" for d in ("2026-01-01", "2026-01-02", "2026-01-03")}
    for date, baseline in (("2026-01-02", 0.87), ("2026-01-03", 0.8125)):
        path = str(evaluate[date] / layout.BLESSING_FILE)
        doc = atomic.read_json(path) | {"baseline": {"accuracy": baseline, "scored": True}}
        atomic.write_json_atomic(path, doc)
    pushes = {"2026-01-01": True, "2026-01-02": False, "2026-01-03": True}
    for date, pushed in pushes.items():
        version = int(date.replace("-", ""))
        push = {"pushed": pushed, "version": version}
        atomic.write_json_atomic(str(evaluate[date] / report.PUSH_FILE), push)
    trend.update_page(str(tmp_path))
    text = page(tmp_path)
    headers = re.findall(r"<th>(.*?)</th>", text)
    assert headers[:7] == ["date", "accuracy", "baseline", "loss", "blessed", "why", "pushed"]
    rows = {d: _cells(text, d) for d in pushes}
    assert [rows[d][2] for d in pushes] == ["–", "0.8700", "0.8125"]
    assert [rows[d][6] for d in pushes] == ["20260101", "–", "20260103"]


def test_the_stage_adds_its_night_to_the_page(make_config, run_root):
    write_night(run_root, "2026-01-30", accuracy=0.5)  # a night evaluated earlier
    metrics = run(make_config(min_accuracy=0.1))
    text = page(run_root)
    assert pages.row_ids(text) == ["night-2026-01-30", f"night-{DATE}"]
    assert f"{metrics['accuracy']:.4f}" in text
    hrefs = [a["href"] for a in pages.tags(text, "a")]
    assert f"{DATE}/evaluate/{report_page.REPORT_HTML_FILE}" in hrefs
    assert all((run_root / href).is_file() for href in hrefs)
    assert (run_root / trend.TREND_PNG).read_bytes()[:8] == PNG_MAGIC


def test_command_line_rewrites_the_page(tmp_path, capsys):
    from evaluate.rewrite_trend import main

    write_night(tmp_path, "2026-01-01", accuracy=0.8)
    assert main(["--output-root", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == f"{tmp_path / trend.INDEX_FILE}: 1 nights"
    assert pages.row_ids(page(tmp_path)) == ["night-2026-01-01"]


def test_command_line_rewrites_a_local_root_without_loading_tensorflow(tmp_path):
    # Run by the pipeline's process after a forced stage: seconds of CPU saved each time.
    write_night(tmp_path, "2026-01-01", accuracy=0.8)
    argv = probe_argv("evaluate.rewrite_trend", "--output-root", str(tmp_path))
    proc = subprocess.run(argv, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [f"{tmp_path / trend.INDEX_FILE}: 1 nights", NOT_LOADED_LINE]
    assert pages.row_ids(page(tmp_path)) == ["night-2026-01-01"]


def test_each_night_shows_where_training_started_and_its_data_size(tmp_path):
    nights = ("2026-01-01", "2026-01-02", "2026-01-03")
    for date in nights:
        write_night(tmp_path, date, accuracy=0.8)
    starts = {
        "2026-01-01": {"mode": "last-blessed", "started_from": None, "cold_start_reason": "x"},
        "2026-01-02": {"mode": "last-blessed", "started_from": {"run_date": "2026-01-01"}},
    }  # the third night trained with warm start off (an older history.json says nothing)
    for date, warm_start in starts.items():
        path = str(tmp_path / date / "train" / layout.HISTORY_FILE)
        atomic.write_json_atomic(path, atomic.read_json(path) | {"warm_start": warm_start})
    for number, date in enumerate(nights[:2], start=1):
        shard_set = {
            "splits": {"train": {"num_examples": 1350 * number}},
            "drops": {"window_days": 3, "days_read": nights[:number]},
        }
        os.makedirs(tmp_path / date / "data")
        atomic.write_json_atomic(str(tmp_path / date / "data" / layout.MANIFEST_FILE), shard_set)
    trend.update_page(str(tmp_path))
    text = page(tmp_path)
    headers = re.findall(r"<th>(.*?)</th>", text)
    assert headers[7:10] == ["started from", "days", "train examples"]
    rows = {d: _cells(text, d)[7:10] for d in nights}
    assert rows == {
        "2026-01-01": ["cold", "1 of 3", "1,350"],
        "2026-01-02": ["2026-01-01", "2 of 3", "2,700"],
        "2026-01-03": ["–", "–", "–"],
    }


def test_failed_refused_and_missing_nights_from_the_ledger_are_rows(tmp_path):
    from contract import ledger

    write_night(tmp_path, "2026-01-01", accuracy=0.9)
    write_night(tmp_path, "2026-01-05", accuracy=0.91)
    for date, outcome, stage, reason in (
        ("2026-01-01", "blessed", None, None),
        ("2026-01-02", "failed", "train", "worker 1 rejected its input"),
        ("2026-01-04", "refused", None, "another run holds the date"),
        ("2026-01-05", "blessed", None, None),
    ):
        when = f"{date}T03:00:00+00:00"
        record = {"date": date, "entry_point": "FullRun", "outcome": outcome, "stage": stage}
        ledger.append(str(tmp_path), record | {"reason": reason, "started_utc": when})
    trend.update_page(str(tmp_path))
    text = page(tmp_path)
    dates_shown = re.findall(r'<tr id="night-([0-9-]+)"', text)
    assert dates_shown == ["2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04", "2026-01-05"]
    cells = {d: _cells(text, d) for d in dates_shown}
    assert (
        cells["2026-01-02"][4] == "failed" and "train: worker 1 rejected" in cells["2026-01-02"][5]
    )
    assert cells["2026-01-03"][4] == "missing"
    assert cells["2026-01-04"][4] == "refused"
    assert all(len(row) == len(cells["2026-01-01"]) for row in cells.values())
    assert "3 not evaluated (failed, refused or missing)" in text
