"""FullRun end to end on tiny Fashion-MNIST with two training workers, through the luigi CLI.

The session's tiny FullRun (tests/tiny_full_run.py), copied, is the run folder that the
following tests share (they run in file order): a rerun that does nothing, a forced evaluate,
an injected training failure, an overlapping run refused by the lock, and a run through a
central scheduler (luigid).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys

import pytest

from contract import atomic, layout, ledger, run_lock
from tests import tiny_full_run as tiny
from tests.factories import PROJECT_ROOT
from tests.tensorflow_probe import NOT_LOADED_LINE, probe_argv
from tests.waiting import wait_until
from train.__main__ import precision_notice
from train.config import auto_precision

pytestmark = pytest.mark.e2e

DATE = tiny.DATE
RETCODE_TASK_FAILED = 30  # luigi.cfg [retcode]
RETCODE_SCHEDULING_ERROR = 35
EVALUATE_FILES = (
    "metrics.json",
    "blessing.json",
    "report.md",
    "confusion_matrix.png",
    "training_curves.png",
)


class Runner:
    """Runs `luigi --module pipeline FullRun` on the tiny dataset under one output root."""

    def __init__(self, root: pathlib.Path, stage_flags: list[str]) -> None:
        self.root = root
        self.stage_flags = stage_flags

    def command(
        self, date: str, *extra: str, scheduler: tuple[str, ...] = (), task: str = "FullRun"
    ) -> list[str]:
        return [
            sys.executable,
            "-m",
            "luigi",
            "--module",
            "pipeline",
            task,
            *(scheduler or ("--local-scheduler",)),
            f"--date={date}",
            f"--output-root={self.root}",
            *self.stage_flags,
            *extra,
        ]

    def env(self) -> dict[str, str]:
        return tiny.env()

    def run(
        self, date: str = DATE, *extra: str, probe: bool = False, **kwargs
    ) -> subprocess.CompletedProcess:
        """Runs the command; with `probe`, through tests.tensorflow_probe (its last stdout line
        says whether Luigi's own process loaded TensorFlow)."""
        command = self.command(date, *extra, **kwargs)
        assert command[1:3] == ["-m", "luigi"]
        return subprocess.run(
            probe_argv("luigi", *command[3:]) if probe else command,
            cwd=PROJECT_ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=600,
        )

    def start(self, date: str, *extra: str, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(
            self.command(date, *extra, **kwargs),
            cwd=PROJECT_ROOT,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def run_dir(self, date: str = DATE) -> pathlib.Path:
        return self.root / date

    def copy_data(self, date: str) -> None:
        """Gives `date` the first run's shard set, so that its Preprocess is already complete."""
        shutil.copytree(self.run_dir() / "data", self.run_dir(date) / "data")


def summary(result: subprocess.CompletedProcess) -> str:
    """luigi's execution summary (it logs to stderr)."""
    text = result.stdout + result.stderr
    marker = "===== Luigi Execution Summary ====="
    start = text.find(marker)
    assert start >= 0, text[-3000:]
    return text[start : text.find(marker, start + len(marker)) + len(marker)]


def mtimes(folder: pathlib.Path) -> dict[str, int]:
    return {
        str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def runner(tiny_full_run, tmp_path_factory):
    """On a copy of the session's tiny FullRun of DATE (tests/tiny_full_run.py), which these
    tests rerun, force and fail; the copy keeps its files' mtimes."""
    root = tmp_path_factory.mktemp("runs")
    shutil.copytree(tiny_full_run.output_root, root, dirs_exist_ok=True)
    return Runner(root, tiny_full_run.stage_flags())


@pytest.fixture(scope="module")
def first_run(runner, tiny_full_run):
    """The shared FullRun of DATE (through the TensorFlow probe): its result and the files'
    mtimes right after it."""
    result = tiny_full_run.result
    assert result.returncode == 0, summary(result)
    return result, mtimes(runner.run_dir())


def test_full_run_writes_every_artefact(runner, first_run):
    result, _ = first_run
    assert "This progress looks :)" in summary(result)
    run = runner.run_dir()
    manifest = atomic.read_json(str(run / "data" / "manifest.json"))
    assert manifest["num_workers"] == 2
    for name in ("model.keras", "history.json", "config.json"):
        assert (run / "train" / name).is_file(), name
    for name in EVALUATE_FILES:
        assert (run / "evaluate" / name).is_file(), name
    metrics = atomic.read_json(str(run / "evaluate" / "metrics.json"))
    assert metrics["num_examples"] == manifest["splits"]["eval"]["num_examples"] == 100
    assert metrics["model"]["training"]["num_workers"] == 2
    # min_accuracy 0 and no earlier blessing: blessed, and latest points at this model.
    pointer = atomic.read_json(str(runner.root / layout.LATEST_POINTER_FILE))
    assert pointer["date"] == DATE
    # Relative to the output root: the runs folder can be moved or mounted elsewhere.
    assert pointer["model_path"] == f"{DATE}/train/model.keras"
    assert (runner.root / pointer["model_path"]).is_file()
    assert pointer["accuracy"] == metrics["accuracy"]
    logs = sorted(p.name for p in (run / "logs").iterdir())
    assert "evaluate.log" in logs
    (luigi_log,) = [name for name in logs if name.startswith("luigi-")]
    assert "Luigi Execution Summary" in (run / "logs" / luigi_log).read_text()
    assert not (run / run_lock.LOCK_FILE).exists()
    # One attempt, one ledger record: its verdict and each stage's figures.
    (record,) = ledger.read(str(runner.root))
    assert (record["date"], record["entry_point"], record["outcome"]) == (
        DATE,
        "FullRun",
        "blessed",
    )
    assert [s["stage"] for s in record["stages"]] == ["Preprocess", "DataGate", "Train", "Evaluate"]
    assert all(s["outcome"] == "succeeded" and s["cpu_seconds"] > 0 for s in record["stages"])
    assert record["bytes_written"] > 0 and record["peak_rss_bytes"] > 0
    # Luigi's own process ran the stages and read their results without TensorFlow: a local
    # root goes through contract.gfile.
    assert result.stdout.splitlines()[-1] == NOT_LOADED_LINE


def test_terminal_shows_stages_epochs_and_the_verdict(first_run):
    result, _ = first_run
    lines = [line for line in result.stderr.splitlines() if line.startswith("[")]
    for stage in ("preprocess", "train", "evaluate"):
        assert any(line.startswith(f"[{stage}] started ") for line in lines), stage
        assert any(line.startswith(f"[{stage}] done in ") for line in lines), stage
    (epoch,) = [line for line in lines if line.startswith("[train] epoch ")]
    assert epoch.startswith("[train] epoch 1/1 loss ")
    for field in (" acc ", " val_loss ", " val_acc ", " lr ", " ex/s", " ETA 0s"):
        assert field in epoch, (field, epoch)
    (verdict,) = [line for line in lines if line.startswith("[evaluate] accuracy ")]
    assert " blessed" in verdict
    # luigi.cfg's precision is auto: the terminal names the policy this CPU got.
    assert f"[train] {precision_notice(auto_precision())}" in lines
    order = [
        next(i for i, x in enumerate(lines) if x.startswith(p))
        for p in (
            "[preprocess] started",
            "[train] started",
            "[train] precision auto",
            "[train] epoch",
            "[evaluate] accuracy",
        )
    ]
    assert order == sorted(order)


def test_second_run_does_nothing_and_never_loads_tensorflow(runner, first_run):
    _, before = first_run
    # Luigi's own process checks every stage's output and the run lock through contract.gfile,
    # which reaches a local root without TensorFlow.
    result = runner.run(probe=True)
    assert result.returncode == 0
    text = summary(result)
    assert "were encountered" in text and "ran successfully" not in text
    assert mtimes(runner.run_dir()) == before
    assert result.stdout.splitlines()[-1] == NOT_LOADED_LINE


def test_forcing_evaluate_reruns_only_evaluate_and_latest_moves_only_on_blessing(runner, first_run):
    _, before = first_run
    run = runner.run_dir()
    pointer_path = runner.root / layout.LATEST_POINTER_FILE
    pointer_before = json.loads(pointer_path.read_text())
    result = runner.run(DATE, "--force-stage=evaluate", "--Evaluate-min-accuracy=0.999")
    assert result.returncode == 0, summary(result)
    text = summary(result)
    ran = text[text.index("ran successfully") :]
    assert "- 1 Evaluate(" in ran and "Train(" not in ran and "Preprocess(" not in ran

    after = mtimes(run)
    for name, mtime in before.items():
        if name.startswith(("data/", "train/")):
            assert after[name] == mtime, name
    assert after["evaluate/metrics.json"] != before["evaluate/metrics.json"]
    (superseded,) = (run / "superseded").iterdir()
    assert json.loads((superseded / "evaluate" / "blessing.json").read_text())["blessed"]

    blessing = json.loads((run / "evaluate" / "blessing.json").read_text())
    assert not blessing["blessed"]
    assert any("below min_accuracy 0.9990" in reason for reason in blessing["reasons"])
    # Not blessed now: the pointer and the served version leave the model this verdict
    # rejects, back to the last blessed night before it; with none, latest.json goes and the
    # version waits in quarantine.
    assert pointer_before["date"] == DATE and not pointer_path.exists()
    assert any("no earlier blessed night is left" in reason for reason in blessing["reasons"])
    served = runner.root / "serving" / "nightly"
    assert not [name for name in os.listdir(served) if name.isdigit()]
    (moved,) = os.listdir(runner.root / "serving" / "nightly.quarantine")
    assert moved.startswith(f"{pointer_before['version']}-")


def test_failing_train_exits_non_zero_then_train_alone_reruns(runner, first_run):
    date = "2026-02-01"
    runner.copy_data(date)
    result = runner.run(date, "--Train-model=nope")
    assert result.returncode == RETCODE_TASK_FAILED, summary(result)
    assert "unknown model 'nope'" in result.stdout + result.stderr
    assert not (runner.run_dir(date) / "train" / "history.json").exists()
    assert not (runner.run_dir(date) / "evaluate" / "metrics.json").exists()

    # `luigi --module pipeline Train --date D` runs just the missing Train.
    result = runner.run(date, task="Train")
    assert result.returncode == 0, summary(result)
    ran = summary(result)[summary(result).index("ran successfully") :]
    assert "- 1 Train(" in ran and "Preprocess(" not in ran and "Evaluate(" not in ran
    assert (runner.run_dir(date) / "train" / "history.json").is_file()
    assert not (runner.run_dir(date) / "evaluate").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def luigid(tmp_path):
    """A central scheduler on a loopback port; yields its --scheduler-* flags."""
    port = _free_port()
    server = subprocess.Popen(
        [
            os.path.join(os.path.dirname(sys.executable), "luigid"),
            f"--port={port}",
            "--address=127.0.0.1",
            f"--state-path={tmp_path / 'luigid.pickle'}",
            f"--logdir={tmp_path}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until(
        lambda: _accepts_connections(port),
        timeout=30,
        alive=lambda: server.poll() is None,
        failure=lambda: "luigid did not start",
    )
    yield ("--scheduler-host=127.0.0.1", f"--scheduler-port={port}")
    server.terminate()
    server.wait(timeout=30)


def _accepts_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def test_overlapping_run_is_refused_and_luigid_run_succeeds(runner, first_run, luigid):
    date = "2026-02-02"
    runner.copy_data(date)
    lock_path = runner.run_dir(date) / run_lock.LOCK_FILE
    first = runner.start(date, scheduler=luigid)
    try:
        wait_until(
            lock_path.exists,
            timeout=120,
            alive=lambda: first.poll() is None,
            failure=lambda: "the first run never took the lock:\n" + first.stdout.read(),
        )
        second = runner.run(date)
        holder = json.loads(lock_path.read_text())
    finally:
        output, _ = first.communicate(timeout=600)

    assert second.returncode == RETCODE_SCHEDULING_ERROR, summary(second)
    refusal = second.stdout + second.stderr
    errors = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
    assert (
        len(errors) == 1 and f"is already in progress (locked by pid {holder['pid']}" in errors[0]
    )
    assert "Traceback" not in refusal
    assert holder["pid"] == first.pid

    assert first.returncode == 0, output[-3000:]
    assert (runner.run_dir(date) / "evaluate" / "metrics.json").is_file()
    assert not lock_path.exists()
