"""The restart loop: runs a cluster of workers until the chief finishes, restarting it whole
when a worker dies, as long as a restart can help and restarts are left.

How a worker is started and stopped sits behind `WorkerBackend`: local processes
(train.local_backend) or one container per worker (train.docker_backend); the loop is the
same for both.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import IO, Protocol

from contract.messages import (
    EXIT_BAD_INPUT,
    EXIT_DISK_FULL,
    EXIT_PREEMPTED,
    notice_line,
    restart_may_help,
)
from train import cluster, worker_logs

BAD_INPUT_EXIT_CODE = EXIT_BAD_INPUT  # a worker found bad input: restarting cannot help
# How often the loop looks at the workers and copies the chief's new log lines: a finished
# launch is seen within this (each look costs microseconds).
POLL_SECONDS = 0.05
STOP_GRACE_SECONDS = 10.0


class LaunchError(RuntimeError):
    """Training could not start or could not finish within the allowed restarts."""


class WorkerBackend(Protocol):
    """Starts and stops worker processes wherever they run."""

    def addresses(self, num_workers: int) -> list[str]:
        """host:port of every worker, for TF_CONFIG's cluster."""
        ...

    def start(self, worker_index: int, tf_config_json: str, attempt: int) -> None: ...

    def poll(self, worker_index: int) -> int | None:
        """The worker's exit code, or None while it runs."""
        ...

    def terminate(self, worker_index: int, grace_seconds: float) -> None:
        """Stops the worker (SIGTERM, then SIGKILL after `grace_seconds`; 0: SIGKILL at once)
        and waits for it."""
        ...

    def log_path(self, worker_index: int) -> str: ...

    def close(self) -> None:
        """Releases what the backend holds, once every worker has stopped."""
        ...


def _stop_all(backend: WorkerBackend, num_workers: int, grace_seconds: float) -> None:
    # In parallel: each terminate may wait out its grace period.
    stoppers = [
        threading.Thread(target=backend.terminate, args=(index, grace_seconds))
        for index in range(num_workers)
    ]
    for stopper in stoppers:
        stopper.start()
    for stopper in stoppers:
        stopper.join()


def run_cluster(
    backend: WorkerBackend, num_workers: int, max_restarts: int, out: IO[str] = sys.stdout
) -> None:
    """Runs the cluster to completion, restarting all workers when any one dies.

    Raises:
        LaunchError: a worker found bad input, or restarts are used up; names the worker
            and its log.
    """
    for attempt in range(max_restarts + 1):
        addresses = backend.addresses(num_workers)
        tail = worker_logs.ChiefTail(backend.log_path(0), out)
        failed = None
        try:
            for index in range(num_workers):
                backend.start(index, cluster.tf_config_json(addresses, index), attempt)
            failed = _watch(backend, num_workers, tail)
        finally:
            _stop_all(backend, num_workers, _grace_for_survivors(failed))
            tail.pump()
        if failed is None:
            return
        index, code = failed
        log_path = backend.log_path(index)
        reason = worker_logs.last_error_line(log_path)
        if code == BAD_INPUT_EXIT_CODE:
            raise LaunchError(f"worker {index} rejected its input: {reason} (log: {log_path})")
        if code == EXIT_DISK_FULL:
            raise LaunchError(
                f"worker {index} ran out of disk space: {reason}; free space and rerun to "
                f"resume (log: {log_path})"
            )
        if not restart_may_help(code):
            raise LaunchError(
                f"worker {index} failed with exit code {code}, which a restart cannot fix: "
                f"{reason} (log: {log_path})"
            )
        if attempt < max_restarts:
            # A notice: the pipeline shows it in the terminal, not only in the stage's log.
            message = (
                f"worker {index} died (exit code {code}, log: {log_path}); restarting the "
                f"cluster (restart {attempt + 1} of {max_restarts})"
            )
            print(notice_line(message), file=out, flush=True)
    raise LaunchError(
        f"worker {index} failed with exit code {code} and max_restarts={max_restarts} "
        f"restarts are used up: {reason} (log: {log_path})"
    )


def _grace_for_survivors(failed: tuple[int, int] | None) -> float:
    """How long the workers still running get to end after SIGTERM before SIGKILL.

    The grace period lets them write a pre-emption backup (the launcher itself was stopped, or
    a worker exited after its pre-emption backup) or tidy up after the chief has finished.
    After any other death no survivor can save anything: every backup is a collective that
    needs all workers, so they are killed at once rather than left stuck in a collective for
    the grace period; the backup on disk is crash-consistent and the restart resumes from it.
    """
    if failed is None or failed[1] == EXIT_PREEMPTED:
        return STOP_GRACE_SECONDS
    return 0.0


def _watch(
    backend: WorkerBackend, num_workers: int, tail: worker_logs.ChiefTail
) -> tuple[int, int] | None:
    """Waits until the chief finishes (None) or some worker fails ((index, exit code))."""
    while True:
        tail.pump()
        codes = [backend.poll(index) for index in range(num_workers)]
        failed = [(index, code) for index, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            # When a peer's loss took others down before this poll, the one a signal ended
            # is the cause: its survivors only failed on a collective with it.
            return min(failed, key=lambda worker: (worker[1] >= 0, worker[0]))
        if codes[0] == 0:
            # The chief writes history.json last; the others only tidy up after it.
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            while time.monotonic() < deadline and any(
                backend.poll(i) is None for i in range(num_workers)
            ):
                time.sleep(POLL_SECONDS)
            return None
        time.sleep(POLL_SECONDS)
