"""pipeline.runner: a stage's log, progress, one-line failure, and its whole process tree."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import luigi
import psutil
import pytest

from pipeline import runner
from tests.waiting import wait_until


class Recorder(luigi.Task):
    """A task that remembers what the runner told Luigi (luigi's worker sets these callbacks)."""

    key = luigi.Parameter(default="", description="Tells instances apart (luigi caches them).")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.progress: list[int] = []
        self.messages: list[str] = []
        self.set_progress_percentage = self.progress.append
        self.set_status_message = self.messages.append


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_output_goes_to_the_log_and_progress_to_luigi(tmp_path):
    task = Recorder(key=str(tmp_path))
    log = tmp_path / "logs" / "stage.log"
    runner.run_stage(
        task,
        "demo",
        python("""
            print("hello")
            print('PROGRESS {"epoch": 3, "epochs": 4, "loss": 0.5, "val_accuracy": 0.875}')
        """),
        str(log),
    )
    text = log.read_text()
    assert text.startswith("$ ") and "hello\n" in text
    assert task.progress == [75]
    assert task.messages == ["epoch 3/4: loss 0.5000, val_accuracy 0.8750"]


def test_notice_lines_reach_the_terminal_and_epoch_lines_follow(tmp_path, capsys):
    task = Recorder(key=str(tmp_path))
    runner.run_stage(
        task,
        "train",
        python("""
            print("NOTICE worker 1 died (exit code -9); restarting the cluster")
            print("NOTICEBOARD is not a notice")
            print('PROGRESS {"epoch": 1, "epochs": 2, "loss": 0.5}')
        """),
        str(tmp_path / "train.log"),
    )
    lines = capsys.readouterr().err.splitlines()
    assert lines[1] == "[train] worker 1 died (exit code -9); restarting the cluster"
    assert lines[2].startswith("[train] epoch 1/2 loss 0.5000")
    assert not any("NOTICEBOARD" in line for line in lines)
    assert "NOTICE worker 1 died" in (tmp_path / "train.log").read_text()


def test_failure_carries_the_stages_own_error_line(tmp_path):
    command = python("""
        import sys
        print("noise")
        print("error: num_workers is 3 but the shard set has 2", file=sys.stderr)
        sys.exit(2)
    """)
    with pytest.raises(runner.StageFailed) as failure:
        runner.run_stage(Recorder(), "train", command, str(tmp_path / "train.log"))
    message = str(failure.value)
    assert message.startswith("the train stage failed: num_workers is 3 but the shard set has 2")
    assert "(exit 2; log: " in message and "\n" not in message
    # The run ledger keeps the stage's own line as the failure's reason.
    assert failure.value.stage == "train"
    assert failure.value.reason == "num_workers is 3 but the shard set has 2"


def test_failure_without_an_error_line_quotes_the_log_tail(tmp_path):
    command = python("""
        import sys
        for i in range(30):
            print("line", i)
        sys.exit(3)
    """)
    with pytest.raises(runner.StageFailed, match=r"exited with 3") as failure:
        runner.run_stage(Recorder(), "evaluate", command, str(tmp_path / "evaluate.log"))
    assert "line 29" in str(failure.value) and "line 9\n" not in str(failure.value)
    assert failure.value.reason == f"exit 3; log: {tmp_path / 'evaluate.log'}"


SPAWNER = """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("CHILD", child.pid, flush=True)
    time.sleep(600)
"""


def child_pid(log) -> int | None:
    for line in log.read_text().splitlines() if log.exists() else []:
        if line.startswith("CHILD "):
            return int(line.split()[1])
    return None


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_an_interrupted_task_ends_the_stages_whole_tree(tmp_path, monkeypatch):
    log = tmp_path / "stage.log"

    def interrupt(task, progress):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "report_progress", interrupt)
    code = SPAWNER.replace(
        "time.sleep(600)\n", 'print("PROGRESS {}", flush=True); time.sleep(600)\n'
    )
    with pytest.raises(KeyboardInterrupt):
        runner.run_stage(Recorder(), "demo", python(code), str(log))
    pid = child_pid(log)
    assert pid is not None
    wait_until(lambda: gone(pid), timeout=30, failure=lambda: f"grandchild {pid} still runs")


LUIGI_STANDIN = """
    import sys
    from pipeline import runner
    runner.run_stage(runner.luigi.Task(), "demo", [sys.executable, "-c", sys.argv[1]], sys.argv[2])
"""


@pytest.mark.slow
def test_a_killed_runner_takes_the_stages_whole_tree_with_it(tmp_path):
    """SIGKILL of the process running the stage (luigi) ends the stage and its children."""
    log = tmp_path / "stage.log"
    standin = subprocess.Popen(
        [*python(LUIGI_STANDIN), textwrap.dedent(SPAWNER), str(log)],
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    try:
        wait_until(
            lambda: child_pid(log) is not None,
            timeout=60,
            alive=lambda: standin.poll() is None,
            failure=lambda: "the stage never started its child",
        )
        stage = [p for p in psutil.Process(standin.pid).children() if p.name() != "sh"]
        os.kill(standin.pid, signal.SIGKILL)
        standin.wait()
        pid = child_pid(log)
        assert pid is not None
        for process in [*stage, psutil.Process(pid)]:
            wait_until(
                lambda p=process: gone(p.pid),
                timeout=90,
                failure=lambda p=process: f"{p.pid} {p.cmdline()} outlived the killed runner",
            )
    finally:
        if standin.poll() is None:
            standin.kill()
