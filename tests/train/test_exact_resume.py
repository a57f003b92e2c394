"""Seeded, exact, crash-consistent training: a run killed anywhere resumes to the same model.

All runs share one small two-worker setting in which early stopping stops the run before its
last epoch and the plateau halves the learning rate on the way, so the state those keep is
under test. The validation labels are each moved to the next class, so the validation loss
rises as the model learns: the run stops at epoch 3 or 4 (epoch 2's loss may still dip below
epoch 1's) on any CPU, where with true labels the epoch it stopped at depended on the CPU's
rounding (4 on one, 10 on another). The nightly recipe's resume is in test_recipe_resume.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import psutil
import pytest

from contract import layout, run_lock
from contract.messages import parse_notice
from tests import forked
from tests.pipeline.test_date_lock_e2e import holds_file
from tests.train.conftest import (
    history,
    launch_argv,
    log_text,
    train_env,
    weights_digest,
    write_small_shard_set,
)
from tests.waiting import wait_until
from train import backup

EXACT_RUN = {
    "epochs": 12,
    "learning_rate": 0.02,
    "early_stopping_patience": 2,
    "reduce_lr_patience": 1,
    "seed": 11,
}
STEPS_PER_EPOCH = 16
# How long a killed stage's processes may take to tear down and free the date's lock: seconds
# when the machine is idle, longer beside a 2 GB image build.
LOCK_RELEASE_SECONDS = 180
START_LINE = re.compile(r"START initial_epoch=(\d+) initial_step=(\d+)")
# What must match between runs: everything in history.json but this attempt's own figures.
ATTEMPT_KEYS = (
    "attempt",
    "resumed_from_step",
    "examples_per_second",
    "wall_time_seconds",
    "fit_return_seconds",
)


def outcome(train_dir: str) -> tuple[str, dict]:
    """The saved weights' digest and the history without the attempt's own figures."""
    doc = history(train_dir)
    return weights_digest(train_dir), {k: v for k, v in doc.items() if k not in ATTEMPT_KEYS}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("exact") / "data")
    write_small_shard_set(path, mislabel_validation=True)
    return path


def train(data_dir: str, train_dir: str, env: dict | None = None, **overrides):
    return forked.run(
        launch_argv(data_dir, train_dir, **{**EXACT_RUN, **overrides}),
        env=env or train_env(),
        timeout=300,
    )


def lock_holders(train_dir: str) -> str:
    """The processes that hold the run's lock file open (pid and command line), for a failure."""
    path = run_lock.RunLock(run_lock.run_dir_of_train_dir(train_dir)).path
    holders = []
    for process in psutil.process_iter():
        try:
            if holds_file(process, path):
                holders.append(f"{process.pid} {' '.join(process.cmdline())[:120]}")
        except (OSError, psutil.Error):
            continue
    return "; ".join(holders) or "none found"


def finished(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def uninterrupted(data_dir, tmp_path_factory) -> tuple[str, dict]:
    """The reference: one run of EXACT_RUN, never interrupted."""
    train_dir = str(tmp_path_factory.mktemp("reference") / "train")
    finished(train(data_dir, train_dir))
    return outcome(train_dir)


@pytest.mark.slow
def test_reference_run_stops_early_after_lowering_the_rate(uninterrupted):
    _, doc = uninterrupted
    assert doc["stopped_early"] is True
    assert doc["epochs_completed"] < EXACT_RUN["epochs"]
    rates = doc["history"]["learning_rate"]
    assert rates[-1] < rates[0] == pytest.approx(EXACT_RUN["learning_rate"])
    val_loss = doc["history"]["val_loss"]
    assert doc["best_epoch"] == val_loss.index(min(val_loss)) + 1 < doc["epochs_completed"]


@pytest.mark.e2e
def test_another_seed_gives_another_run(data_dir, tmp_path, uninterrupted):
    train_dir = str(tmp_path / "train")
    finished(train(data_dir, train_dir, seed=EXACT_RUN["seed"] + 1, epochs=1))
    first_epoch = {k: v[0] for k, v in history(train_dir)["history"].items()}
    reference = {k: v[0] for k, v in uninterrupted[1]["history"].items()}
    assert first_epoch["loss"] != reference["loss"]
    assert first_epoch["val_loss"] != reference["val_loss"]


@pytest.mark.e2e
def test_test_time_flips_change_what_is_validated_not_the_training(
    data_dir, tmp_path, uninterrupted
):
    train_dir = str(tmp_path / "train")
    finished(train(data_dir, train_dir, epochs=1, test_time_augment="flip"))
    first_epoch = {k: v[0] for k, v in history(train_dir)["history"].items()}
    reference = {k: v[0] for k, v in uninterrupted[1]["history"].items()}
    assert first_epoch["loss"] == reference["loss"]
    assert first_epoch["accuracy"] == reference["accuracy"]
    assert first_epoch["val_loss"] != reference["val_loss"]


# Two kills in one launch, one per attempt: worker 1 inside the second epoch, then, on the
# restart, the chief right after the second epoch's validation (before its backup).
KILLS = (f"1:{STEPS_PER_EPOCH + 7}", "0:validated-2")


@pytest.mark.e2e
def test_killed_worker_resumes_to_the_uninterrupted_run_despite_retried_backup_writes(
    data_dir, tmp_path, uninterrupted
):
    train_dir = str(tmp_path / "train")
    # Before the first kill, the chief's first two writes of the first backup fail: neither the
    # retries nor the restarts may show in the model.
    env = train_env(TRAIN_FAULT_KILL_AT_STEP=",".join(KILLS), **{backup.FAULT_IO_ENV: "1:2:EIO"})
    proc = train(data_dir, train_dir, env=env)
    finished(proc)
    assert "retry 2" in log_text(train_dir, 0)
    died(proc, [int(kill.split(":")[0]) for kill in KILLS])
    assert outcome(train_dir) == uninterrupted
    doc = history(train_dir)
    assert doc["attempt"] == len(KILLS)
    starts = chief_starts(train_dir)
    # Each restart resumed from the last backup, at most save_freq_steps back: the first inside
    # the second epoch, the second at or after it.
    assert len(starts) == len(KILLS) + 1
    assert STEPS_PER_EPOCH < starts[1][1] <= starts[2][1] == doc["resumed_from_step"]
    assert not os.path.exists(os.path.join(train_dir, layout.BACKUP_DIR))


def chief_starts(train_dir: str) -> list[tuple[int, int]]:
    """(epoch, step) of each attempt's start in the chief's log, in order."""
    return [(int(e), int(s)) for e, s in START_LINE.findall(log_text(train_dir, 0))]


def died(proc: subprocess.CompletedProcess, workers: list[int]) -> None:
    """The launch saw each of `workers` die, in turn, and restarted the cluster after each."""
    notices = [n for n in map(parse_notice, proc.stdout.splitlines()) if n is not None]
    assert len(notices) == len(workers), notices
    for restart, (notice, worker) in enumerate(zip(notices, workers, strict=True), 1):
        assert notice.startswith(f"worker {worker} died")
        assert f"restarting the cluster (restart {restart} of" in notice


@pytest.mark.e2e
def test_killed_stage_resumes_on_rerun_to_the_uninterrupted_run(data_dir, tmp_path, uninterrupted):
    train_dir = str(tmp_path / "train")
    argv = launch_argv(data_dir, train_dir, **EXACT_RUN)
    env = train_env(TRAIN_FAULT_KILL_AT_STEP=f"1:stage-{2 * STEPS_PER_EPOCH + 3}")
    # Its own session: the fault SIGKILLs the launcher and both workers, as a killed Luigi would.
    killed = forked.run(argv, env=env, timeout=300, start_new_session=True)
    assert killed.returncode == -9
    assert not os.path.exists(os.path.join(train_dir, layout.HISTORY_FILE))
    # The kernel frees the date's lock when the last killed worker has torn down, which on a
    # loaded machine can lag the launcher's own end; a rerun before that is refused, as it
    # should be.
    wait_until(
        lambda: run_lock.is_free(run_lock.run_dir_of_train_dir(train_dir)),
        timeout=LOCK_RELEASE_SECONDS,
        failure=lambda: (
            f"the killed stage's processes still hold the date's lock after "
            f"{LOCK_RELEASE_SECONDS} s: {lock_holders(train_dir)}"
        ),
    )
    # The rerun's chief is killed in turn, after the last step with the model and checkpoint
    # written and before history.json: the kill point after training is tested on this rerun
    # rather than on a launch of its own. The first writes of the rerun's first backup fail.
    env = train_env(TRAIN_FAULT_KILL_AT_STEP="0:saved", **{backup.FAULT_IO_ENV: "1:2:EIO"})
    rerun = train(data_dir, train_dir, env=env)
    finished(rerun)
    assert "retry 2" in log_text(train_dir, 0)
    died(rerun, [0])
    assert outcome(train_dir) == uninterrupted
    doc = history(train_dir)
    assert doc["attempt"] == 1
    # Killed after the last step: the restart trains nothing, it only writes the files. The
    # chief's log holds the killed stage's start and the rerun's first attempt's, no third.
    starts = chief_starts(train_dir)
    assert len(starts) == 2 and doc["resumed_from_step"] == doc["steps_trained_total"]
    # No fit ran in this attempt (the run's throughput arithmetic is a unit test).
    assert doc["fit_return_seconds"] is None
    assert not os.path.exists(os.path.join(train_dir, layout.BACKUP_DIR))


@pytest.mark.e2e
def test_full_disk_fails_cleanly_keeps_the_backup_and_settings_are_checked(
    data_dir, tmp_path, uninterrupted
):
    train_dir = str(tmp_path / "train")
    full = train(
        data_dir,
        train_dir,
        env=train_env(**{backup.FAULT_IO_ENV: "2:1000:ENOSPC"}),
        max_restarts=0,
    )
    assert full.returncode == 1
    errors = [line for line in full.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "no space left on the device" in errors[0], full.stderr[-3000:]
    assert "the previous backup (ckpt-1) is intact" in errors[0]
    for worker in (0, 1):  # both workers stopped at the same save, neither hung
        assert "DiskFullError" in log_text(train_dir, worker)
    folder = os.path.join(train_dir, layout.BACKUP_DIR)
    with open(os.path.join(folder, backup.STATE_FILE)) as f:
        assert json.load(f)["checkpoint"] == "ckpt-1"
    assert os.path.exists(os.path.join(folder, "ckpt-1.index"))

    epochs = EXACT_RUN["epochs"]
    other = train(data_dir, train_dir, seed=EXACT_RUN["seed"] + 1, epochs=epochs + 1)
    assert other.returncode == 2
    errors = [line for line in other.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, other.stderr[-3000:]
    assert f"epochs {epochs} -> {epochs + 1}" in errors[0]
    assert f"seed {EXACT_RUN['seed']} -> " in errors[0]
    assert "--force-stage train" in errors[0] and "backup's settings" in errors[0]

    finished(train(data_dir, train_dir))  # the intact backup resumes to the same model
    assert outcome(train_dir) == uninterrupted
