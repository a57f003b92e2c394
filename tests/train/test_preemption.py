"""SIGTERM (a pre-emption) mid-epoch: the workers save one last backup together, then exit; a
rerun resumes from it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from contract import layout
from tests.factories import PROJECT_ROOT
from tests.train.conftest import history, launch_argv, log_text, train_env, write_small_shard_set

STEPS_PER_EPOCH = 16  # 256 examples per worker, 16 per batch
SAVE_FREQ_STEPS = 200  # a periodic backup mid-epoch 12, the next one far off
EPOCHS = 40


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
        env=train_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        periodic = None
        while periodic is None and launch.poll() is None and time.monotonic() < deadline:
            periodic = _backup_position(train_dir)
            time.sleep(0.05)
        assert periodic is not None, f"no periodic backup was written: {launch.communicate()}"
        assert periodic[0] == SAVE_FREQ_STEPS
        launch.send_signal(signal.SIGTERM)  # as Luigi or a pod's pre-emption stops it
        launch.communicate(timeout=60)
    finally:
        launch.kill()
        launch.wait()
    saved = _backup_position(train_dir)
    assert saved is not None
    # One more save than the periodic one, further on: written after the SIGTERM.
    assert saved[1] == periodic[1] + 1 and saved[0] > periodic[0], (periodic, saved)
    assert saved[0] < EPOCHS * STEPS_PER_EPOCH  # training had not finished
    assert "exiting after SIGTERM: backup ckpt-" in log_text(train_dir, 0)
    assert "exiting after SIGTERM: backup ckpt-" in log_text(train_dir, 1)
    assert not os.path.exists(os.path.join(train_dir, layout.HISTORY_FILE))

    resumed = subprocess.run(
        launch_argv(data_dir, train_dir, **settings),
        cwd=PROJECT_ROOT,
        env=train_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    done = history(train_dir)
    assert done["resumed_from_step"] == saved[0]
    assert done["steps_trained_total"] == EPOCHS * STEPS_PER_EPOCH
