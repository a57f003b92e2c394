"""SIGTERM (a pre-emption) mid-epoch: the workers save one last backup together, then exit; a
rerun resumes from it."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from contract import layout
from tests import forked
from tests.factories import PROJECT_ROOT
from tests.train.conftest import history, launch_argv, log_text, train_env, write_small_shard_set
from tests.waiting import wait_until
from train.cluster import HOLD_ENV

STEPS_PER_EPOCH = 16  # 256 examples per worker, 16 per batch
SAVE_FREQ_STEPS = 20  # a periodic backup in epoch 2
HOLD_AT_STEP = 25  # the workers wait there, mid-epoch 2, for the SIGTERM
EPOCHS = 2  # the held step lies in the last epoch: the rerun trains what is left of it
HOLDING = f"FAULT holding at step {HOLD_AT_STEP}"


def _log(train_dir: str, worker: int) -> str:
    try:
        return log_text(train_dir, worker)
    except FileNotFoundError:
        return ""


def _backup_position(train_dir: str) -> tuple[int, int] | None:
    """(global step, saves) of the backup's state.json, or None before the first backup."""
    path = os.path.join(train_dir, layout.BACKUP_DIR, "state.json")
    try:
        with open(path) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state["epoch"] * STEPS_PER_EPOCH + state["step"], state["saves"]


@pytest.mark.e2e
def test_sigterm_saves_a_backup_that_a_rerun_resumes(tmp_path):
    data_dir, train_dir = str(tmp_path / "data"), str(tmp_path / "train")
    write_small_shard_set(data_dir)
    settings = {"epochs": EPOCHS, "save_freq_steps": SAVE_FREQ_STEPS}
    launch = subprocess.Popen(
        launch_argv(data_dir, train_dir, **settings),
        cwd=PROJECT_ROOT,
        env=train_env(**{HOLD_ENV: str(HOLD_AT_STEP)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Held at a known step, past the periodic backup, for as long as it takes to see it:
        # the SIGTERM lands mid-epoch on a machine of any speed.
        wait_until(
            lambda: all(HOLDING in _log(train_dir, worker) for worker in (0, 1)),
            timeout=300,
            alive=lambda: launch.poll() is None,
            failure=lambda: (
                f"the workers never held at step {HOLD_AT_STEP}: "
                f"{launch.poll()} {_log(train_dir, 0)[-2000:]}"
            ),
        )
        periodic = _backup_position(train_dir)
        assert periodic is not None and periodic[0] == SAVE_FREQ_STEPS, periodic
        launch.send_signal(signal.SIGTERM)  # as Luigi or a pod's pre-emption stops it
        launch.communicate(timeout=60)
    finally:
        launch.kill()
        launch.wait()
    saved = _backup_position(train_dir)
    assert saved is not None
    # One more save than the periodic one: the held step ends (global step 26), the first
    # worker to see the SIGTERM there claims the next step, and all save after step 27.
    assert saved[1] == periodic[1] + 1 and saved[0] == HOLD_AT_STEP + 2, (periodic, saved)
    assert "exiting after SIGTERM: backup ckpt-" in log_text(train_dir, 0)
    assert "exiting after SIGTERM: backup ckpt-" in log_text(train_dir, 1)
    assert not os.path.exists(os.path.join(train_dir, layout.HISTORY_FILE))

    resumed = forked.run(launch_argv(data_dir, train_dir, **settings), env=train_env(), timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    done = history(train_dir)
    assert done["resumed_from_step"] == saved[0]
    assert done["steps_trained_total"] == EPOCHS * STEPS_PER_EPOCH
