"""Output roots other than a local folder: the stage target, the local state folder, and an
unsupported scheme (s3://) refused with one line before any work, by every stage and by FullRun.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys

import luigi
import pytest

from contract import storage
from pipeline import Evaluate, FullRun, Preprocess, Train
from pipeline.targets import GFileTarget
from tests.factories import PROJECT_ROOT

DATE = datetime.date(2026, 1, 31)
S3_ROOT = "s3://bucket/runs"
RETCODE_SCHEDULING_ERROR = 35  # luigi.cfg [retcode]
EXIT_BAD_INPUT = 2
REFUSAL = (
    f"error: output root {S3_ROOT} uses storage scheme 's3://', which this pipeline does not "
    "support (TensorFlow has no s3 filesystem here); use a local path or gs://"
)


@pytest.mark.parametrize(
    ("task", "marker"),
    [
        (Preprocess, "data/manifest.json"),
        (Train, "train/history.json"),
        (Evaluate, "evaluate/metrics.json"),
    ],
)
def test_every_stage_task_ends_with_one_gfile_target(task, marker, tmp_path):
    local = task(date=DATE, output_root=str(tmp_path)).output()
    remote = task(date=DATE, output_root="gs://bucket/runs").output()
    assert isinstance(local, GFileTarget) and isinstance(remote, GFileTarget)
    assert remote.path == f"gs://bucket/runs/2026-01-31/{marker}"
    assert not local.exists()
    os.makedirs(os.path.dirname(local.path))
    with local.open("w") as f:
        f.write("{}")
    assert local.exists() and task(date=DATE, output_root=str(tmp_path)).complete()


def test_a_remote_root_keeps_its_locks_and_logs_in_the_local_state_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(storage.STATE_DIR_ENV, str(tmp_path))
    assert storage.local_state_dir("runs/2026-01-31") == "runs/2026-01-31"
    assert storage.local_state_dir("gs://b/runs/2026-01-31/logs") == str(
        tmp_path / "gs" / "b" / "runs" / "2026-01-31" / "logs"
    )
    assert storage.local_state_dir("gs://b/../x/./y") == str(tmp_path / "gs" / "b" / "x" / "y")


@pytest.mark.parametrize("path", ["runs", "/abs/runs", "gs://bucket/runs"])
def test_local_paths_and_gs_are_supported(path):
    storage.check_supported(path)


def test_s3_is_refused_naming_the_scheme_and_what_is_supported():
    with pytest.raises(storage.UnsupportedStorageError) as e:
        storage.check_supported(S3_ROOT)
    assert "error: " + str(e.value) == REFUSAL


def _run(args: list[str], cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=os.environ | {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout=300,
    )


def _error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")]


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ["-m", "preprocess", "run", f"--output_root={S3_ROOT}", "--date=2026-01-31"],
        ["-m", "evaluate", f"--output-root={S3_ROOT}", "--date=2026-01-31"],
        ["-m", "train", "launch", "--num-workers=2"]
        + [f"--data-dir={S3_ROOT}/2026-01-31/data", f"--train-dir={S3_ROOT}/2026-01-31/train"],
    ],
    ids=["preprocess", "evaluate", "train"],
)
def test_each_stage_refuses_s3_in_one_line_before_any_work(args, tmp_path):
    result = _run(args, str(tmp_path))
    assert result.returncode == EXIT_BAD_INPUT, result.stderr[-2000:]
    (line,) = _error_lines(result)
    assert "storage scheme 's3://'" in line and "use a local path or gs://" in line
    assert os.listdir(tmp_path) == []  # nothing written, not even a local 's3:' folder


@pytest.mark.slow
def test_full_run_refuses_s3_with_the_same_line_before_scheduling(tmp_path):
    env_state = tmp_path / "state"
    result = subprocess.run(
        [sys.executable, "-m", "luigi", "--module", "pipeline", "FullRun", "--local-scheduler"]
        + ["--date=2026-01-31", f"--output-root={S3_ROOT}"],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        env=os.environ
        | {
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONPATH": str(PROJECT_ROOT),
            "LUIGI_CONFIG_PATH": str(PROJECT_ROOT / "luigi.cfg"),
            storage.STATE_DIR_ENV: str(env_state),
        },
        timeout=300,
    )
    assert result.returncode == RETCODE_SCHEDULING_ERROR, result.stderr[-3000:]
    assert _error_lines(result) == [REFUSAL]
    assert "ran successfully" not in result.stderr
    assert os.listdir(tmp_path) == []  # no lock, no log, no 's3:' or 'logs' folder


def test_full_run_task_refuses_before_touching_anything():
    with pytest.raises(storage.UnsupportedStorageError):
        FullRun(date=DATE, output_root=S3_ROOT).complete()


@pytest.fixture
def docker_executor():
    config = luigi.configuration.get_config()
    had_section = config.has_section("Executor")
    if not had_section:
        config.add_section("Executor")
    before = config.get("Executor", "kind", None)
    config.set("Executor", "kind", "docker")
    yield
    if before is None:
        config.remove_option("Executor", "kind")
    else:
        config.set("Executor", "kind", before)


def test_a_gs_root_with_the_docker_executor_is_refused_in_one_line(capsys, docker_executor):
    with pytest.raises(storage.UnsupportedStorageError):
        FullRun(date=DATE, output_root="gs://bucket/runs").complete()
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and "[Executor] kind = docker" in line
    assert "use kind = local for a gs:// root" in line
