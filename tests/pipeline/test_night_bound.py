"""[FullRun] max_hours: a night past its bound has its running stage stopped, whole tree, and
fails in one line naming the bound; no stage starts after it; a bad bound is refused."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from contract import ledger
from pipeline import full_run, runner
from tests.factories import PROJECT_ROOT
from tests.pipeline.test_runner import SPAWNER, Recorder, child_pid, gone, python
from tests.waiting import wait_until

# The stages are found by their command lines here (conftest.own_processes).
OWN_PROCESSES = True
DATE = "2026-01-31"
RETCODE_TASK_FAILED = 30  # luigi.cfg [retcode]


def bound(seconds_from_now: float) -> runner.Deadline:
    return runner.Deadline(time.monotonic() + seconds_from_now, "[FullRun] max_hours=0.0003", 1.1)


def test_a_stage_running_at_the_deadline_is_stopped_with_its_whole_tree(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "_deadline", bound(3.0))  # room for a slow VM to spawn
    log = tmp_path / "stage.log"
    with pytest.raises(runner.StageFailed) as failure:
        runner.run_stage(Recorder(key=str(tmp_path)), "train", python(SPAWNER), str(log))
    reason = failure.value.reason
    assert reason.startswith("night exceeded [FullRun] max_hours=0.0003 (1s): the train stage ")
    assert "was stopped after" in reason and "\n" not in reason
    pid = child_pid(log)
    assert pid is not None  # the stage had started its child before the deadline
    wait_until(lambda: gone(pid), timeout=30, failure=lambda: f"grandchild {pid} still runs")


def test_no_stage_starts_after_the_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "_deadline", bound(-1.0))
    marker = tmp_path / "ran"
    command = python(f"open({str(marker)!r}, 'w').close()")
    with pytest.raises(runner.StageFailed) as failure:
        runner.run_stage(Recorder(key=str(tmp_path)), "evaluate", command, str(tmp_path / "e.log"))
    assert "the evaluate stage was not started" in failure.value.reason
    assert not marker.exists()


def test_a_stage_that_ends_before_the_deadline_is_untouched(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "_deadline", bound(600.0))
    runner.run_stage(
        Recorder(key=str(tmp_path)), "demo", python("print('ok')"), str(tmp_path / "l")
    )
    assert "ok\n" in (tmp_path / "l").read_text()


@pytest.mark.parametrize("value", ["-1", "0", "abc", "nan", "inf"])
def test_a_bad_bound_is_one_error_line_and_exit_2(value, capsys):
    with pytest.raises(SystemExit) as stopped:
        full_run.checked_hours(value)
    assert stopped.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: [FullRun] max_hours must be a number of hours above 0")
    assert repr(value) in line


def test_fractions_and_empty_are_bounds():
    assert full_run.checked_hours("0.0005") == 0.0005
    assert full_run.checked_hours(" ") is None and full_run.checked_hours(12) == 12.0


def full_run_command(root, *flags: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", "FullRun", "--local-scheduler", f"--date={DATE}"] + [
        f"--output-root={root}",
        *flags,
    ]


def run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        command,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env=os.environ | {"TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout=300,
    )


def test_a_bad_bound_on_the_command_line_stops_before_anything_runs(tmp_path):
    root = tmp_path / "runs"
    result = run(full_run_command(root, "--FullRun-max-hours=-2"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: [FullRun] max_hours must")
    assert not root.exists()


def processes_under(root) -> list[str]:
    """Command lines of the processes that name `root` (the night's stages)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if str(root) in line and process.pid != os.getpid():
            found.append(line)
    return found


@pytest.fixture
def stuck_dataset(tmp_path) -> str:
    """A TFRecord "file" that is a named pipe nobody writes: a stage reading it never ends."""
    fifo = tmp_path / "source" / "stuck.tfrecord"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    return f"tfrecord:{fifo}"


def test_a_stuck_night_fails_at_its_bound_and_its_record_says_so(tmp_path, stuck_dataset):
    root = tmp_path / "runs"
    # 3.6 s: the bound starts when FullRun runs, and luigi starts the stage milliseconds after
    # that (seconds to spare on a slow VM too); the stage never ends by itself.
    result = run(full_run_command(root, f"--dataset={stuck_dataset}", "--max-hours=0.001"))
    assert result.returncode == RETCODE_TASK_FAILED, result.stderr[-3000:]
    (record,) = ledger.read(str(root))
    assert (record["outcome"], record["stage"]) == (ledger.FAILED, "Preprocess")
    prefix = "night exceeded [FullRun] max_hours=0.001 (4s): the preprocess stage was stopped after"
    assert record["reason"].startswith(prefix)
    assert "[preprocess] FAILED after " in result.stderr and f"s: {prefix}" in result.stderr
    data = root / DATE / "data"
    assert not (data / "manifest.json").exists() and not (data / "data_gate.json").exists()
    wait_until(
        lambda: not processes_under(tmp_path / "source"),
        timeout=90,
        failure=lambda: f"the stage outlived its night: {processes_under(tmp_path / 'source')}",
    )
