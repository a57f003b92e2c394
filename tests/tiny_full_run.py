"""One tiny FullRun that every test process of a session reads: the `tiny_full_run` fixture.

tests/pipeline/test_full_run_e2e.py starts from it (on a copy: its tests rerun, force and fail
stages) and tests/docker/ compares its container FullRun with it. The first process that asks
builds it under a lock in the folder pytest-xdist's processes share; the others wait for it
and read what it left. Nothing may write into it.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import json
import os
import pathlib
import subprocess

from tests.factories import PROJECT_ROOT
from tests.preprocess.conftest import build_tiny_tfds, tiny_full_run_flags, write_tiny_sources
from tests.tensorflow_probe import probe_argv

DATE = "2026-01-31"
# A backup every two of the run's four steps: the container FullRun (tests/docker/) resumes
# from one after a worker container is killed.
SAVE_FREQ_STEPS = 2
RESULT_FILE = "result.json"


@dataclasses.dataclass(frozen=True)
class TinyFullRun:
    """Where the run's inputs and output root are, and what `luigi ... FullRun` printed."""

    folder: pathlib.Path

    @functools.cached_property
    def result(self) -> subprocess.CompletedProcess:
        fields = json.loads((self.folder / RESULT_FILE).read_text())
        return subprocess.CompletedProcess(["luigi"], **fields)

    @property
    def sources(self) -> str:
        return str(self.folder / "sources")

    @property
    def sums(self) -> str:
        return str(self.folder / "sources.sha256")

    @property
    def tfds_dir(self) -> str:
        return str(self.folder / "tfds")

    @property
    def output_root(self) -> pathlib.Path:
        return self.folder / "runs"

    @property
    def run_dir(self) -> pathlib.Path:
        return self.output_root / DATE

    def stage_flags(self) -> list[str]:
        return [
            *tiny_full_run_flags(self.tfds_dir, self.sources, self.sums),
            f"--Train-save-freq-steps={SAVE_FREQ_STEPS}",
        ]


def command(output_root: str, stage_flags: list[str], date: str = DATE) -> list[str]:
    """`luigi --module pipeline FullRun` of `date` on the tiny dataset, local scheduler."""
    return [
        "--module",
        "pipeline",
        "FullRun",
        "--local-scheduler",
        f"--date={date}",
        f"--output-root={output_root}",
        *stage_flags,
    ]


def env() -> dict[str, str]:
    return os.environ | {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}


def shared(folder: pathlib.Path) -> TinyFullRun:
    """The run in `folder`, made there by the first caller of any process (the others wait on
    the folder's lock): luigi's CLI through tests.tensorflow_probe, whose last stdout line says
    whether Luigi's own process loaded TensorFlow."""
    run = TinyFullRun(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result_path = folder / RESULT_FILE
        if not result_path.exists():
            (folder / "sources").mkdir(exist_ok=True)
            sums = write_tiny_sources(folder / "sources")
            os.replace(sums, run.sums)
            build_tiny_tfds(run.tfds_dir, run.sources, run.sums)
            argv = probe_argv("luigi", *command(str(run.output_root), run.stage_flags()))
            done = subprocess.run(
                argv, cwd=PROJECT_ROOT, env=env(), capture_output=True, text=True, timeout=900
            )
            fields = {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
            result_path.with_suffix(".tmp").write_text(json.dumps(fields))
            os.replace(result_path.with_suffix(".tmp"), result_path)
    return run
