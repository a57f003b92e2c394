"""Run dates: only `YYYY-MM-DD` calendar dates, refused in one line at every entry point."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys

import pytest

from contract import dates, layout
from contract.messages import ERROR_PREFIX, EXIT_BAD_INPUT
from tests.factories import PROJECT_ROOT
from tests.tensorflow_probe import NOT_LOADED_LINE, probe_argv

BAD_DATES = ["20260131", "2026-W05-6", "2026-02-30", "../x", "2026-1-5", " 2026-01-31", ""]


def test_parse_takes_only_iso_calendar_dates():
    assert dates.parse("2026-01-31") == datetime.date(2026, 1, 31)
    assert dates.parse("2024-02-29") == datetime.date(2024, 2, 29)
    for text in [*BAD_DATES, "2026-01-31T00:00", "２０２６-01-31", None]:
        with pytest.raises(dates.DateError, match="YYYY-MM-DD"):
            dates.parse(text)


def test_a_bad_date_names_no_folder():
    with pytest.raises(dates.DateError, match=r"'\.\./x'"):
        layout.train_dir("runs", "../x")
    assert layout.train_dir("runs", "2026-01-31") == "runs/2026-01-31/train"


def test_dates_compare_as_dates_not_text():
    # As text "20261231" > "2026-12-30" ('2' > '-'): a pointer written with it held back
    # every later night for a year.
    assert not dates.is_later("20261231", "2026-12-30")
    assert dates.is_later("2026-12-30", "20261231")
    assert dates.is_later("2026-02-01", "2026-01-31")
    assert not dates.is_later("2026-01-31", "2026-01-31")
    assert not dates.is_later(None, "2026-01-31")


def _run(command: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        command,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


def _assert_refused(done: subprocess.CompletedProcess, value: str) -> None:
    errors = [line for line in done.stderr.splitlines() if line.startswith(ERROR_PREFIX)]
    assert done.returncode == EXIT_BAD_INPUT, done.stderr[-2000:]
    assert len(errors) == 1 and "YYYY-MM-DD" in errors[0] and repr(value) in errors[0], errors
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("value", ["20260131", "2026-W05-6", "2026-02-30", "../x"])
def test_luigi_refuses_a_bad_date_before_anything_runs(tmp_path, value):
    done = _run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "--local-scheduler",
            "--date",
            value,
            "--output-root",
            str(tmp_path / "runs"),
        ],  # fmt: skip
    )
    _assert_refused(done, value)
    assert not (tmp_path / "runs").exists()


def test_luigi_refuses_a_lax_date_of_a_single_task(tmp_path):
    # luigi's own DateParameter reads 2026-1-5 as 2026-01-05.
    done = _run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "Train",
            "--local-scheduler",
            "--date",
            "2026-1-5",
            "--output-root",
            str(tmp_path / "runs"),
        ],  # fmt: skip
    )
    _assert_refused(done, "2026-1-5")


@pytest.mark.parametrize("value", ["20260131", "2026-W05-6", "2026-02-30", "../x"])
def test_the_evaluate_cli_refuses_a_bad_date(tmp_path, capsys, value):
    from evaluate.__main__ import main

    assert main(["--output-root", str(tmp_path), "--date", value]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(ERROR_PREFIX) and repr(value) in err[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["20260131", "2026-W05-6"])
def test_the_preprocess_cli_refuses_a_bad_date(tmp_path, value):
    done = _run(probe_argv("preprocess", "run", "--output_root", str(tmp_path / "runs"),
                           "--date", value))  # fmt: skip
    _assert_refused(done, value)
    assert not (tmp_path / "runs").exists()
    # Refused before the job (and TensorFlow) is loaded.
    assert done.stdout.splitlines()[-1] == NOT_LOADED_LINE


@pytest.mark.parametrize("value", ["20260131", "2026-02-30", "../x"])
def test_the_image_entrypoint_refuses_compose_run_date(tmp_path, value):
    # compose passes RUN_DATE to every service; the entrypoint checks it before the stage.
    path = f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"
    entrypoint = str(PROJECT_ROOT / "docker" / "entrypoint.sh")
    marker = tmp_path / "ran"
    done = _run(["sh", entrypoint, "touch", str(marker)], RUN_DATE=value, PATH=path)
    _assert_refused(done, value)
    assert not marker.exists()
    done = _run(["sh", entrypoint, "touch", str(marker)], RUN_DATE="2026-01-31", PATH=path)
    assert done.returncode == 0, done.stderr
    assert marker.exists()


@pytest.mark.parametrize("stage", ["preprocess", "preprocess.data_gate", "evaluate.rewrite_trend"])
def test_the_image_entrypoint_runs_a_stage_or_a_stage_module(stage):
    # The data gate's container is started as `IMAGE preprocess.data_gate ARGS...`.
    path = f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"
    entrypoint = str(PROJECT_ROOT / "docker" / "entrypoint.sh")
    done = _run(["sh", entrypoint, stage, "--help"], PATH=path)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
