"""Failures a restart cannot fix end the launch at once; the others restart the cluster."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess

import pytest

from contract.messages import (
    EXIT_BAD_INPUT,
    EXIT_DISK_FULL,
    EXIT_PREEMPTED,
    EXIT_RETRYABLE,
    parse_notice,
)
from tests import forked
from tests.train.conftest import launch_argv, train_env, write_small_shard_set
from train.restarts import STOP_GRACE_SECONDS, LaunchError, run_cluster


class ScriptedBackend:
    """Workers that exit with the codes given per attempt (worker 1 fails, worker 0 waits)."""

    def __init__(self, tmp_path, codes_by_attempt: list[int]) -> None:
        self.codes = codes_by_attempt
        self.tmp_path = tmp_path
        self.attempts: list[int] = []
        self.stops: list[tuple[int, float]] = []  # (worker, grace seconds) per stop

    def addresses(self, num_workers: int) -> list[str]:
        return [f"127.0.0.1:{1000 + i}" for i in range(num_workers)]

    def start(self, worker_index: int, tf_config_json: str, attempt: int) -> None:
        if worker_index == 0:
            self.attempts.append(attempt)

    def poll(self, worker_index: int) -> int | None:
        code = self.codes[self.attempts[-1]]
        if code == 0:
            return 0
        return code if worker_index == 1 else None

    def terminate(self, worker_index: int, grace_seconds: float) -> None:
        self.stops.append((worker_index, grace_seconds))

    def log_path(self, worker_index: int) -> str:
        return str(self.tmp_path / f"worker-{worker_index}.log")

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (EXIT_BAD_INPUT, "worker 1 rejected its input"),
        (EXIT_DISK_FULL, "worker 1 ran out of disk space"),
        (1, "worker 1 failed with exit code 1, which a restart cannot fix"),
    ],
)
def test_permanent_failures_are_not_restarted(tmp_path, code, message):
    backend = ScriptedBackend(tmp_path, [code, 0, 0])
    out = io.StringIO()
    with pytest.raises(LaunchError, match=message):
        run_cluster(backend, 2, max_restarts=2, out=out)
    assert backend.attempts == [0]
    assert out.getvalue() == ""


@pytest.mark.parametrize("code", [EXIT_RETRYABLE, -9, 137, 143])
def test_failures_a_restart_may_fix_restart_the_cluster(tmp_path, code):
    backend = ScriptedBackend(tmp_path, [code, code, 0])
    out = io.StringIO()
    run_cluster(backend, 2, max_restarts=2, out=out)
    assert backend.attempts == [0, 1, 2]
    notices = [parse_notice(line) for line in out.getvalue().splitlines()]
    assert len(notices) == 2 and f"exit code {code}" in str(notices[0])


@pytest.mark.parametrize(
    ("code", "grace"),
    [
        # No survivor can save once a peer is gone (a save is a collective): killed at once.
        (EXIT_BAD_INPUT, 0.0),
        (-9, 0.0),
        (1, 0.0),
        # A pre-emption exit: the peers are writing the same backup and get the grace period.
        (EXIT_PREEMPTED, STOP_GRACE_SECONDS),
        # The chief finished: the others tidy up.
        (0, STOP_GRACE_SECONDS),
    ],
)
def test_survivors_of_a_dead_worker_are_killed_at_once(tmp_path, code, grace):
    backend = ScriptedBackend(tmp_path, [code])
    with pytest.raises(LaunchError) if code != 0 else contextlib.nullcontext():
        run_cluster(backend, 2, max_restarts=0, out=io.StringIO())
    assert sorted(backend.stops) == [(0, grace), (1, grace)]


class PeerLostBackend(ScriptedBackend):
    """Worker 1 is SIGKILLed; by the first poll worker 0 has failed too, on a collective with
    it (its peer's connection reset)."""

    def poll(self, worker_index: int) -> int | None:
        if self.attempts[-1] > 0:
            return 0
        return 1 if worker_index == 0 else -9


def test_the_worker_a_signal_ended_is_named_not_the_peer_that_failed_on_its_loss(tmp_path):
    backend = PeerLostBackend(tmp_path, [])
    out = io.StringIO()
    run_cluster(backend, 2, max_restarts=1, out=out)
    notice = str(parse_notice(out.getvalue().splitlines()[0]))
    assert "worker 1 died (exit code -9" in notice


@pytest.fixture
def tiny_disk(tmp_path):
    """A 300 KiB tmpfs: the train folder's first backup does not fit on it."""
    path = tmp_path / "tiny"
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(path)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs CAP_SYS_ADMIN): {mounted.stderr!r}")
    yield str(path)
    subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.e2e
def test_a_full_disk_is_not_retried(tmp_path, tiny_disk):
    data_dir, train_dir, log_dir = str(tmp_path / "data"), tiny_disk, str(tmp_path / "logs")
    write_small_shard_set(data_dir)
    full = forked.run(
        [*launch_argv(data_dir, train_dir, max_restarts=2), "--log-dir", log_dir],
        env=train_env(),
        timeout=300,
    )
    assert full.returncode == 1
    errors = [line for line in full.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "ran out of disk space" in errors[0], full.stderr[-3000:]
    assert "no space left on the device" in errors[0]
    assert not [line for line in full.stdout.splitlines() if parse_notice(line)]
    for worker in (0, 1):
        with open(os.path.join(log_dir, f"worker-{worker}.log")) as f:
            starts = [line for line in f if line.startswith("=== attempt")]
        assert starts == [f"=== attempt 0 worker {worker} ===\n"]
