"""A luigi killed with SIGKILL mid-Train leaves no launcher and no worker running."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

import psutil
import pytest

from contract import layout
from tests.factories import PROJECT_ROOT
from tests.train.conftest import write_small_shard_set
from tests.waiting import wait_until

# The stages are found by their command lines here (conftest.own_processes).
OWN_PROCESSES = True
pytestmark = pytest.mark.e2e

DATE = "2026-01-31"


def stage_processes(train_dir: str) -> list[psutil.Process]:
    """Live processes whose command line names `train_dir`: the launcher and its workers."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(train_dir in part for part in process.info["cmdline"] or ()):
            found.append(process)
    return found


def test_sigkill_of_luigi_mid_train_ends_launcher_and_workers(tmp_path):
    root = str(tmp_path / "runs")
    write_small_shard_set(layout.data_dir(root, DATE))
    train_dir = layout.train_dir(root, DATE)
    chief_log = pathlib.Path(train_dir, "logs", "worker-0.log")
    command = [sys.executable, "-m", "luigi", "--module", "pipeline", "Train", "--local-scheduler"]
    command += [f"--date={DATE}", f"--output-root={root}", "--Train-model=mlp"]
    command += ["--Train-epochs=1000", "--Train-per-worker-batch-size=16"]
    env = os.environ | {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    luigi_log = tmp_path / "luigi.log"
    with open(luigi_log, "wb") as out:
        luigi = subprocess.Popen(
            command, cwd=PROJECT_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        # Mid-Train: the chief has finished an epoch, so launcher and both workers run.
        wait_until(
            lambda: chief_log.exists() and "PROGRESS" in chief_log.read_text(errors="replace"),
            timeout=300,
            alive=lambda: luigi.poll() is None,
            failure=lambda: luigi_log.read_text()[-3000:],
            interval=0.5,
        )
        assert len(stage_processes(train_dir)) >= 3  # launcher + 2 workers
    finally:
        os.kill(luigi.pid, signal.SIGKILL)
        luigi.wait()
    wait_until(
        lambda: not stage_processes(train_dir),
        timeout=120,
        failure=lambda: (
            "still running after luigi was killed: "
            + "; ".join(" ".join(p.cmdline()[:6]) for p in stage_processes(train_dir))
        ),
        interval=0.5,
    )
