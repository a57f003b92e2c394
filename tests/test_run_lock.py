"""The per-date run lock: refusal names the holder, a dead holder frees it, and the stages a
holder starts adopt it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from contract import atomic, run_lock, storage
from tests.factories import PROJECT_ROOT

HOLD_AND_WAIT = """
import sys, time
from contract.run_lock import RunLock
RunLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(120)
"""


def test_second_holder_is_refused_with_the_first_named(tmp_path):
    first = run_lock.RunLock(str(tmp_path / "2026-01-31"))
    first.acquire()
    holder = json.loads((tmp_path / "2026-01-31" / ".lock").read_text())
    assert holder["pid"] == os.getpid()

    second = run_lock.RunLock(str(tmp_path / "2026-01-31"))
    with pytest.raises(run_lock.RunLockedError, match=f"already in progress .*pid {os.getpid()}"):
        second.acquire()
    assert not second.held

    first.release()
    assert not (tmp_path / "2026-01-31" / ".lock").exists()
    second.acquire()
    assert second.held
    second.release()


def test_other_dates_are_independent(tmp_path):
    a = run_lock.RunLock(str(tmp_path / "2026-01-30"))
    b = run_lock.RunLock(str(tmp_path / "2026-01-31"))
    a.acquire()
    b.acquire()
    assert a.held and b.held
    a.release()
    b.release()


def test_is_free_takes_nothing_it_does_not_let_go(tmp_path):
    run_dir = str(tmp_path / "2026-01-31")
    assert run_lock.is_free(run_dir)
    holder = run_lock.RunLock(run_dir)
    holder.acquire()
    assert not run_lock.is_free(run_dir)
    holder.release()
    assert run_lock.is_free(run_dir) and not os.path.exists(holder.path)


@pytest.mark.slow
def test_killed_holder_leaves_no_stale_lock(tmp_path):
    run_dir = str(tmp_path / "2026-01-31")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_WAIT, run_dir],
        stdout=subprocess.PIPE,
        text=True,
        cwd=PROJECT_ROOT,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(run_lock.RunLockedError, match=f"pid {holder.pid} on "):
            run_lock.RunLock(run_dir).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The file is still there, but the kernel dropped the dead holder's flock.
    assert os.path.exists(os.path.join(run_dir, ".lock"))
    lock = run_lock.RunLock(run_dir)
    lock.acquire()
    assert atomic.read_json(lock.path)["pid"] == os.getpid()
    lock.release()


def test_hold_for_process_is_idempotent(tmp_path):
    run_dir = str(tmp_path / "2026-01-31")
    try:
        assert run_lock.hold_for_process(run_dir) is True
        assert run_lock.hold_for_process(run_dir) is False
        with pytest.raises(run_lock.RunLockedError):
            run_lock.RunLock(run_dir).acquire()
    finally:
        run_lock._release_all()
    assert not os.path.exists(os.path.join(run_dir, ".lock"))


def test_remote_run_folder_is_locked_locally(tmp_path, monkeypatch):
    monkeypatch.setenv(storage.STATE_DIR_ENV, str(tmp_path))
    first = run_lock.RunLock("gs://bucket/runs/2026-01-31")
    # In the local state folder, per machine: flock cannot lock an object on the store.
    assert first.path == str(tmp_path / "gs" / "bucket" / "runs" / "2026-01-31" / ".lock")
    assert run_lock.RunLock("gs://bucket/runs/2026-02-01").path != first.path
    first.acquire()
    try:
        with pytest.raises(run_lock.RunLockedError, match="gs://bucket/runs/2026-01-31"):
            run_lock.RunLock("gs://bucket/runs/2026-01-31").acquire()
    finally:
        first.release()


ADOPT = """
import sys
from contract import run_lock
try:
    print("took" if run_lock.hold_for_process(sys.argv[1]) else "adopted", flush=True)
except run_lock.RunLockedError:
    print("refused", flush=True)
"""


@pytest.mark.slow
def test_a_stage_given_the_descriptor_adopts_the_lock_and_others_are_refused(tmp_path):
    run_dir = str(tmp_path / "2026-01-31")

    def start_stage(**popen) -> str:
        return subprocess.run(
            [sys.executable, "-c", ADOPT, run_dir],
            capture_output=True,
            text=True,
            cwd=PROJECT_ROOT,
            check=True,
            **popen,
        ).stdout.strip()

    try:
        assert run_lock.hold_for_process(run_dir) is True
        assert start_stage(pass_fds=run_lock.held_fds()) == "adopted"
        assert start_stage() == "refused"  # named in the environment, not given the descriptor
        # The adopting stage left the lock to its parent: still held, file in place.
        with pytest.raises(run_lock.RunLockedError):
            run_lock.RunLock(run_dir).acquire()
    finally:
        run_lock._release_all()
    assert start_stage() == "took"


def test_a_stage_in_a_container_leaves_the_lock_to_the_process_that_started_it(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(run_lock.HELD_OUTSIDE_ENV, "1")
    assert run_lock.hold_for_process(str(tmp_path / "2026-01-31")) is False
    assert not (tmp_path / "2026-01-31" / run_lock.LOCK_FILE).exists()
