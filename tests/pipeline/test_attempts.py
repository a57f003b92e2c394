"""Every attempt of an entry point leaves one ledger record: refused, skipped and finished ones,
and a ledger that cannot be written never fails the run."""

from __future__ import annotations

import datetime
import json
import logging
import os
import subprocess
import sys

import pytest

from contract import ledger, run_lock
from pipeline import attempts
from tests.factories import PROJECT_ROOT

DATE = "2026-01-31"
RETCODE_TASK_FAILED = 30  # luigi.cfg [retcode]
RETCODE_SCHEDULING_ERROR = 35


def run_pipeline(task: str, root, *flags: str) -> subprocess.CompletedProcess:
    """`python -m pipeline TASK --local-scheduler --date DATE --output-root ROOT FLAGS...`."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", task, "--local-scheduler", f"--date={DATE}"]
        + [f"--output-root={root}", *flags],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env=os.environ | {"TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout=300,
    )


@pytest.mark.parametrize(
    ("task", "code"),
    [("FullRun", RETCODE_SCHEDULING_ERROR), ("Preprocess", RETCODE_TASK_FAILED)],
)
def test_a_run_refused_by_the_date_lock_leaves_a_refused_record(tmp_path, task, code):
    root = tmp_path / "runs"
    lock = run_lock.RunLock(str(root / DATE))
    lock.acquire()
    try:
        result = run_pipeline(task, root)
    finally:
        lock.release()
    assert result.returncode == code, result.stderr[-3000:]
    (record,) = ledger.read(str(root))
    assert record["outcome"] == ledger.REFUSED
    assert (record["date"], record["entry_point"], record["stage"]) == (DATE, task, task)
    assert f"already in progress (locked by pid {os.getpid()}" in record["reason"]
    assert "\n" not in record["reason"]
    # FullRun refuses before scheduling; a stage alone takes the lock as it starts to run.
    assert [s["outcome"] for s in record["stages"]] == ([] if task == "FullRun" else ["refused"])
    assert record["ended_utc"] >= record["started_utc"]
    assert record["versions"]["luigi"] and record["versions"]["tensorflow"]
    assert record["schema"] == ledger.SCHEMA_VERSION


def test_a_stage_already_complete_is_recorded_as_skipped(tmp_path):
    root = tmp_path / "runs"
    evaluate_dir = root / DATE / "evaluate"
    evaluate_dir.mkdir(parents=True)
    (evaluate_dir / "metrics.json").write_text(json.dumps({"accuracy": 0.9}))
    result = run_pipeline("Evaluate", root)
    assert result.returncode == 0, result.stderr[-3000:]
    (record,) = ledger.read(str(root))
    assert (record["entry_point"], record["outcome"]) == ("Evaluate", ledger.SKIPPED_COMPLETE)
    assert record["bytes_written"] == 0 and record["reason"] is None


def attempt(root, entry_point: str = "FullRun") -> attempts.Attempt:
    return attempts.Attempt(
        task_id="t", entry_point=entry_point, date=DATE, output_root=str(root), bytes_at_start=0
    )


@pytest.mark.parametrize(
    ("entry_point", "blessed", "outcome"),
    [
        ("FullRun", True, ledger.BLESSED),
        ("Evaluate", False, ledger.NOT_BLESSED),
        ("Train", True, ledger.SUCCEEDED),  # a stage alone leaves no verdict of its own
    ],
)
def test_a_finished_run_takes_its_outcome_from_the_blessing(
    tmp_path, entry_point, blessed, outcome
):
    evaluate_dir = tmp_path / DATE / "evaluate"
    evaluate_dir.mkdir(parents=True)
    (evaluate_dir / "blessing.json").write_text(json.dumps({"blessed": blessed}))
    finished = attempt(tmp_path, entry_point)
    finished.succeeded = True
    record = finished.record()
    assert record["outcome"] == outcome and record["stage"] is None
    assert record["bytes_written"] == (evaluate_dir / "blessing.json").stat().st_size


def test_a_run_that_never_completed_is_failed_with_the_first_reason(tmp_path):
    stopped = attempt(tmp_path)
    stopped.stopped(ledger.FAILED, "DataGate", "data gate: the label\ndistribution moved")
    stopped.stopped(ledger.FAILED, "FullRun", "later")
    record = stopped.record()
    assert (record["outcome"], record["stage"]) == (ledger.FAILED, "DataGate")
    assert record["reason"] == "data gate: the label distribution moved"
    assert attempt(tmp_path).record()["outcome"] == ledger.FAILED  # no event: not complete


def test_a_ledger_that_cannot_be_written_only_warns(tmp_path, monkeypatch, caplog):
    root = tmp_path / "runs"
    root.write_text("a file where the output root should be")
    monkeypatch.setattr(attempts, "_current", attempt(root))
    with caplog.at_level(logging.WARNING, logger="luigi-interface"):
        assert attempts.finish() is None
    assert "could not write the run ledger under" in caplog.text
    assert attempts.finish() is None  # written (or not) once


def test_a_task_checked_outside_a_luigi_command_line_begins_no_attempt(tmp_path):
    from pipeline import Evaluate

    task = Evaluate(date=datetime.date(2026, 1, 31), output_root=str(tmp_path))
    assert not task.complete()
    assert attempts._current is None
    assert attempts.finish() is None and not ledger.has_ledger(str(tmp_path))


def test_the_git_revision_is_the_checkouts_commit_and_none_elsewhere(tmp_path):
    assert attempts.git_revision(tmp_path) is None
    if not (PROJECT_ROOT / ".git").exists():
        pytest.skip("the project is not a git checkout here")
    head = subprocess.run(
        ["git", "-C", str(PROJECT_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    assert attempts.git_revision() == head.stdout.strip() and len(head.stdout.strip()) == 40
