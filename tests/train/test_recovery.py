"""Fault tolerance: a worker killed mid-epoch restarts the cluster; a killed Train resumes."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess

import pytest

from contract import layout
from tests.factories import PROJECT_ROOT
from tests.train.conftest import SMALL_RUN, launch_argv, train_env, write_small_shard_set
from tests.waiting import wait_until

STEPS_PER_EPOCH = 256 // SMALL_RUN["per_worker_batch_size"]
START_LINE = re.compile(r"START initial_epoch=(\d+) initial_step=(\d+)")


def history(train_dir: str) -> dict:
    with open(os.path.join(train_dir, layout.HISTORY_FILE)) as f:
        return json.load(f)


def log_text(train_dir: str, worker: int) -> str:
    with open(os.path.join(train_dir, "logs", f"worker-{worker}.log")) as f:
        return f.read()


@pytest.mark.e2e
def test_killed_worker_restarts_cluster_and_resumes_from_backup(tmp_path, run_train):
    data_dir, train_dir = str(tmp_path / "data"), str(tmp_path / "train")
    write_small_shard_set(data_dir)
    kill_step = STEPS_PER_EPOCH + 7  # mid-epoch, in the second epoch
    proc = run_train(data_dir, train_dir, env=train_env(TRAIN_FAULT_KILL_AT_STEP=f"1:{kill_step}"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "worker 1 died" in proc.stdout and "restarting the cluster" in proc.stdout
    assert f"FAULT killing myself at step {kill_step}" in log_text(train_dir, 1)

    doc = history(train_dir)
    uninterrupted = SMALL_RUN["epochs"] * STEPS_PER_EPOCH
    assert doc["attempt"] == 1
    assert doc["steps_trained_total"] == uninterrupted
    assert doc["epochs_completed"] == SMALL_RUN["epochs"]
    assert len(doc["history"]["val_loss"]) == SMALL_RUN["epochs"]
    # The restart resumed from the last backup, not from scratch: it redid fewer than
    # save_freq steps, so all steps executed exceed an uninterrupted run's by at most that.
    resumed = doc["resumed_from_step"]
    starts = [int(m.group(2)) for m in START_LINE.finditer(log_text(train_dir, 0))]
    assert starts == [0, resumed]
    assert 0 < resumed <= kill_step
    executed = kill_step + (uninterrupted - resumed)
    assert uninterrupted < executed <= uninterrupted + SMALL_RUN["save_freq_steps"]
    assert f"END steps_executed={uninterrupted - resumed}" in log_text(train_dir, 0)
    leftovers = glob.glob(os.path.join(train_dir, "**", "*workertemp*"), recursive=True)
    assert leftovers == []


@pytest.mark.e2e
def test_killed_train_resumes_on_rerun(tmp_path, run_train):
    data_dir, train_dir = str(tmp_path / "data"), str(tmp_path / "train")
    write_small_shard_set(data_dir)
    epochs = 12
    proc = subprocess.Popen(
        launch_argv(data_dir, train_dir, epochs=epochs),
        cwd=PROJECT_ROOT,
        env=train_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    backup = os.path.join(train_dir, layout.BACKUP_DIR)
    try:
        wait_until(
            lambda: bool(glob.glob(os.path.join(backup, "chief", "checkpoint"))),
            timeout=240,
            alive=lambda: proc.poll() is None,
            failure=lambda: "no backup written before training ended or the wait ran out",
            interval=0.05,
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its workers
        proc.wait()
    assert not os.path.exists(os.path.join(train_dir, layout.HISTORY_FILE))

    rerun = run_train(data_dir, train_dir, epochs=epochs)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    doc = history(train_dir)
    starts = [int(m.group(2)) for m in START_LINE.finditer(log_text(train_dir, 0))]
    assert starts[-1] == doc["resumed_from_step"] > 0
    assert doc["steps_trained_total"] == epochs * STEPS_PER_EPOCH
    assert doc["epochs_completed"] == epochs
