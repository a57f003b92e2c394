"""One run of a date at a time, whichever entry point starts it, until its last process is gone.

A luigi Train of a date trains; `python -m train launch` of the same date is refused in one
line. Then luigi is SIGKILLed while its launcher and workers still run (held stopped, so they
cannot finish stopping before the check): the date stays locked until they are gone.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys

import psutil
import pytest

from contract import layout, run_lock
from tests.factories import PROJECT_ROOT
from tests.train.conftest import SMALL_RUN, launch_argv, train_env, write_small_shard_set
from tests.waiting import wait_until
from train import forker

# The stages' command lines and descriptors are looked at here (conftest.own_processes).
OWN_PROCESSES = True
pytestmark = pytest.mark.e2e

DATE = datetime.date(2026, 1, 31)


def stage_processes(train_dir: str) -> dict[str, list[psutil.Process]]:
    """The launcher, the workers' forker and the workers training into `train_dir`."""
    found: dict[str, list[psutil.Process]] = {"launch": [], "forker": [], "worker": []}
    for process in psutil.process_iter(["cmdline", "name"]):
        cmdline = process.info["cmdline"] or []
        if train_dir in cmdline and "train" in cmdline:
            if process.info["name"] == forker.NAME.decode():
                found["forker"].append(process)
            elif "launch" in cmdline or "worker" in cmdline:
                found["launch" if "launch" in cmdline else "worker"].append(process)
    return found


def read_text(path: str) -> str:
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        return f.read()


def holds_file(process: psutil.Process, path: str) -> bool:
    folder = f"/proc/{process.pid}/fd"
    for fd in os.listdir(folder):
        try:
            if os.readlink(os.path.join(folder, fd)) == path:
                return True
        except OSError:
            continue
    return False


def test_a_date_is_locked_by_every_entry_point_and_by_the_stage_tree(tmp_path):
    root = str(tmp_path / "runs")
    date = DATE.isoformat()
    data_dir, train_dir = layout.data_dir(root, date), layout.train_dir(root, date)
    write_small_shard_set(data_dir)
    settings = {**SMALL_RUN, "epochs": 500}
    luigi_argv = [sys.executable, "-m", "luigi", "--module", "pipeline", "Train"]
    luigi_argv += ["--local-scheduler", "--date", date, "--output-root", root]
    luigi_argv += ["--num-workers", "2"]
    for name in ("model", "epochs", "per_worker_batch_size", "save_freq_steps"):
        luigi_argv += [f"--{name.replace('_', '-')}", str(settings[name])]
    luigi = subprocess.Popen(
        luigi_argv,
        cwd=PROJECT_ROOT,
        env=train_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    processes: list[psutil.Process] = []
    try:
        chief_log = os.path.join(train_dir, "logs", "worker-0.log")
        wait_until(
            lambda: "START initial_epoch" in read_text(chief_log),
            timeout=240,
            alive=lambda: luigi.poll() is None,
            failure=lambda: "the luigi Train never started training",
        )
        second = subprocess.run(
            launch_argv(data_dir, train_dir, **settings),
            cwd=PROJECT_ROOT,
            env=train_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert second.returncode == 1
        errors = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, second.stderr[-3000:]
        assert f"run {layout.run_dir(root, date)} is already in progress" in errors[0]
        assert f"locked by pid {luigi.pid} " in errors[0]

        stage = stage_processes(train_dir)
        assert len(stage["launch"]) == len(stage["forker"]) == 1, stage
        assert len(stage["worker"]) == 2, stage
        processes = stage["launch"] + stage["forker"] + stage["worker"]
        lock_path = run_lock.RunLock(layout.run_dir(root, date)).path
        assert all(holds_file(p, lock_path) for p in processes)
        # Held stopped, the launcher and the workers outlive luigi until they are let go.
        for process in processes:
            process.send_signal(signal.SIGSTOP)
        os.kill(luigi.pid, signal.SIGKILL)
        luigi.wait(timeout=60)
        with pytest.raises(run_lock.RunLockedError, match="already in progress"):
            run_lock.RunLock(layout.run_dir(root, date)).acquire()
        assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes)

        for process in processes:
            process.send_signal(signal.SIGCONT)  # the SIGTERMs they were sent now end them
        wait_until(
            lambda: not any(p.is_running() for p in processes),
            timeout=120,
            failure=lambda: f"the stage outlived luigi: {processes}",
        )
        lock = run_lock.RunLock(layout.run_dir(root, date))
        lock.acquire()  # the last of them gone, the date is free
        lock.release()
    finally:
        for process in processes:
            try:
                process.send_signal(signal.SIGKILL)
                process.send_signal(signal.SIGCONT)
            except psutil.NoSuchProcess:
                pass
        if luigi.poll() is None:
            os.killpg(luigi.pid, signal.SIGKILL)
            luigi.wait()
