"""The same night from any folder: the project's luigi.cfg is read; a failed night never exits 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from contract.messages import EXIT_BAD_INPUT
from pipeline import config_file, params
from tests.factories import PROJECT_ROOT


def test_the_working_folders_or_the_named_file_is_left_to_luigi(tmp_path):
    (tmp_path / "luigi.cfg").write_text("[Preprocess]\n")
    assert config_file.locate(tmp_path, {}) == (None, None)
    assert config_file.locate(Path("/"), {"LUIGI_CONFIG_PATH": str(tmp_path / "luigi.cfg")}) == (
        None,
        None,
    )


def test_from_another_folder_the_projects_file_is_read(tmp_path):
    assert config_file.locate(tmp_path, {}) == (PROJECT_ROOT / "luigi.cfg", None)


def test_a_named_file_that_is_missing_or_no_file_at_all_is_a_refusal(tmp_path, monkeypatch):
    found, problem = config_file.locate(tmp_path, {"LUIGI_CONFIG_PATH": str(tmp_path / "x.cfg")})
    assert found is None and f"LUIGI_CONFIG_PATH names {tmp_path / 'x.cfg'}" in problem
    monkeypatch.setattr(config_file, "PROJECT_ROOT", tmp_path / "installed")
    found, problem = config_file.locate(tmp_path, {})
    assert found is None and f"no luigi.cfg in {tmp_path}" in problem
    monkeypatch.setattr(config_file, "problem", problem)
    with pytest.raises(params.BadParameterExit) as refused:
        params.refuse_bad_parameters()
    assert refused.value.code == EXIT_BAD_INPUT and "LUIGI_CONFIG_PATH" in str(refused.value)


def _failing_night(cwd: Path, **environment: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LUIGI_CONFIG_PATH"}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "Preprocess", "--local-scheduler"]
        + ["--date=2026-01-31", f"--output-root={cwd / 'runs'}"]
        + [f"--dataset=imagefolder:{cwd / 'no-such-folder'}"],
        cwd=cwd,
        env=env | {"PYTHONPATH": str(PROJECT_ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"} | environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_a_failed_night_exits_non_zero_from_any_folder_and_any_configuration(tmp_path):
    started_elsewhere = _failing_night(tmp_path)
    assert started_elsewhere.returncode == config_file.RETCODES["task_failed"]
    assert f"reading {PROJECT_ROOT / 'luigi.cfg'}" in started_elsewhere.stderr
    # A configuration of the user's own without [retcode]: still not 0.
    own = tmp_path / "own.cfg"
    own.write_text("[Preprocess]\nnum_workers = 1\n")
    with_own = _failing_night(tmp_path, LUIGI_CONFIG_PATH=str(own))
    assert with_own.returncode == config_file.RETCODES["task_failed"], with_own.stderr[-2000:]
    assert "reading" not in with_own.stderr
