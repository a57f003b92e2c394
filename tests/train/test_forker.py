"""Local workers are forked from one process that imported the worker's code (train.forker): they
look and behave as workers started on their own, the launcher survives the forker's death, and
TRAIN_FORK_WORKERS=0 starts each worker on its own."""

from __future__ import annotations

import pathlib
import signal
import subprocess

import psutil
import pytest

from tests.factories import PROJECT_ROOT
from tests.train.conftest import history, launch_argv, train_env, write_small_shard_set
from tests.waiting import wait_until
from train import forker
from train.cluster import HOLD_ENV

# The forker's and its workers' command lines are looked at here (conftest.own_processes).
OWN_PROCESSES = True
pytestmark = pytest.mark.e2e


def held_launch(tmp_path, **env: str) -> tuple[subprocess.Popen, str]:
    """A two-worker launch whose first attempt holds at step 3 until stopped."""
    data_dir, train_dir = str(tmp_path / "data"), str(tmp_path / "train")
    write_small_shard_set(data_dir)
    launch = subprocess.Popen(
        launch_argv(data_dir, train_dir, epochs=1),
        cwd=PROJECT_ROOT,
        env=train_env(**{HOLD_ENV: "3"}, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return launch, train_dir


def wait_for_held_workers(launch: subprocess.Popen, train_dir: str) -> None:
    logs = [pathlib.Path(train_dir, "logs", f"worker-{i}.log") for i in range(2)]

    def both_hold() -> bool:
        texts = [p.read_text() if p.exists() else "" for p in logs]
        return all("FAULT holding at step 3" in text for text in texts)

    wait_until(
        both_hold,
        timeout=240,
        alive=lambda: launch.poll() is None,
        failure=lambda: f"the workers never reached step 3: {launch.poll()}",
    )


def is_worker_command(argv: list[str], train_dir: str) -> bool:
    """Whether `argv` is `python -m train worker ...` training into `train_dir`."""
    return argv[1:4] == ["-m", "train", "worker"] and train_dir in argv


def test_workers_are_forked_look_like_workers_and_a_dead_forker_is_restarted(tmp_path):
    launch, train_dir = held_launch(tmp_path)
    try:
        wait_for_held_workers(launch, train_dir)
        children = psutil.Process(launch.pid).children()  # and the private network's holder
        (server,) = [child for child in children if child.name() == forker.NAME.decode()]
        workers = server.children()
        assert len(workers) == 2
        # As `ps` and `pgrep -f` see them: the worker's own command line, under its own name.
        assert is_worker_command(server.cmdline(), train_dir)
        assert all(worker.cmdline() == server.cmdline() for worker in workers)
        assert all(worker.name() != server.name() for worker in workers)

        server.send_signal(signal.SIGKILL)  # its workers die with it; the launcher restarts
        out, err = launch.communicate(timeout=300)
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
    assert launch.returncode == 0, err[-3000:]
    assert "died (exit code -9" in out and "restarting the cluster (restart 1 of" in out
    assert not any(worker.is_running() for worker in workers)
    assert history(train_dir)["epochs_completed"] == 1


def test_without_forking_each_worker_is_the_launchers_own_process(tmp_path):
    launch, train_dir = held_launch(tmp_path, **{forker.ENABLE_ENV: "0"})
    try:
        wait_for_held_workers(launch, train_dir)
        children = psutil.Process(launch.pid).children()  # and the private network's holder
        workers = [child for child in children if "worker" in child.cmdline()]
        assert len(workers) == 2
        assert all(is_worker_command(worker.cmdline(), train_dir) for worker in workers)
        assert all(worker.name() != forker.NAME.decode() for worker in workers)
        launch.send_signal(signal.SIGTERM)  # the held workers back up and stop
        launch.communicate(timeout=120)
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
    assert launch.returncode == 143
    assert not any(worker.is_running() for worker in workers)
