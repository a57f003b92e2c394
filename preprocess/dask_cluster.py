"""A local Dask cluster for the preprocess stage: one scheduler and N workers on 127.0.0.1.

    python -m preprocess.dask_cluster start --workers 2 [--state-dir .cache/dask] [--port 0]
    python -m preprocess.dask_cluster stop [--state-dir .cache/dask]
    python -m preprocess.dask_cluster status [--state-dir .cache/dask]

`start` prints the scheduler address (tcp://127.0.0.1:PORT) for
`python -m preprocess run ... --runner=DaskRunner --dask_client_address=tcp://...` and records
the pids it started in `<state-dir>/cluster.json`; `stop` ends exactly those processes (each
checked to still be the `dask` process that was started) and nothing else.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from contract.messages import EXIT_BAD_INPUT, EXIT_FAILED, error_line

STATE_FILE = "cluster.json"
DEFAULT_STATE_DIR = ".cache/dask"
DEFAULT_MEMORY_LIMIT = "4GiB"  # per worker
# Dask pauses a worker whose process memory passes 80% of its limit until it drops. Memory a
# worker cannot spill (TensorFlow and Beam themselves, the bundle being processed) does not
# drop while it waits, so with every worker paused the job hung for good (seen at 6M examples
# with 2 GiB workers). Workers here spill instead of pausing.
WORKER_ENV = {"DASK_DISTRIBUTED__WORKER__MEMORY__PAUSE": "False"}


class ClusterError(Exception):
    """The cluster could not be started, or its state is not what was recorded."""


def _dask_command() -> list[str]:
    return [sys.executable, "-m", "dask"]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive_as_started(pid: int, role: str) -> bool:
    """The pid runs, and is the dask process of that role (not a reused pid)."""
    line = _cmdline(pid)
    return "dask" in line and role in line


def _read_state(state_dir: str) -> dict[str, Any] | None:
    path = os.path.join(state_dir, STATE_FILE)
    try:
        with open(path) as f:
            state: dict[str, Any] = json.load(f)
            return state
    except FileNotFoundError:
        return None


def _scheduler_workers(address: str, timeout: float) -> int:
    from distributed import Client

    with Client(address, timeout=timeout) as client:
        return len(client.scheduler_info()["workers"])


def start(
    workers: int,
    state_dir: str,
    port: int = 0,
    threads: int = 1,
    timeout: float = 120.0,
    memory_limit: str = DEFAULT_MEMORY_LIMIT,
) -> dict[str, Any]:
    """Starts a scheduler and `workers` worker processes; returns the recorded state.

    Each worker spills task results to its local folder beyond 60-70% of `memory_limit`
    (Dask's defaults), which is what keeps a worker's memory flat as the data grows.

    Raises:
        ClusterError: a cluster recorded in `state_dir` still runs, or the cluster did not
            come up with all its workers within `timeout` (what was started is stopped).
    """
    if workers < 1:
        raise ClusterError(f"--workers must be at least 1, got {workers}")
    state = _read_state(state_dir)
    if state and _alive_as_started(state["scheduler_pid"], "scheduler"):
        raise ClusterError(f"a cluster from {state_dir} runs at {state['address']}: stop it first")
    os.makedirs(state_dir, exist_ok=True)
    state_dir = os.path.abspath(state_dir)
    scheduler_file = os.path.join(state_dir, "scheduler.json")
    with contextlib.suppress(FileNotFoundError):
        os.remove(scheduler_file)
    logs: list[Any] = []

    def spawn(args: list[str], name: str) -> subprocess.Popen[bytes]:
        log = open(os.path.join(state_dir, f"{name}.log"), "ab")  # noqa: SIM115
        logs.append(log)
        return subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=state_dir,
            start_new_session=True,
            env=os.environ | WORKER_ENV,
        )

    scheduler = spawn(
        [*_dask_command(), "scheduler", "--host", "127.0.0.1", "--port", str(port),
         "--dashboard-address", "127.0.0.1:0", "--scheduler-file", scheduler_file],
        "scheduler",
    )  # fmt: skip
    state = {"scheduler_pid": scheduler.pid, "worker_pids": [], "state_dir": state_dir}
    try:
        deadline = time.monotonic() + timeout
        while not os.path.exists(scheduler_file):
            if scheduler.poll() is not None or time.monotonic() > deadline:
                raise ClusterError(f"the Dask scheduler did not start: see {state_dir}")
            time.sleep(0.2)
        time.sleep(0.2)  # the file is written whole, but give the writer its close
        with open(scheduler_file) as f:
            address = json.load(f)["address"]
        state["address"] = address
        for i in range(workers):
            worker = spawn(
                [*_dask_command(), "worker", address, "--nworkers", "1",
                 "--nthreads", str(threads), "--host", "127.0.0.1",
                 "--dashboard-address", "127.0.0.1:0",  # the dashboard has no authentication
                 "--local-directory", os.path.join(state_dir, f"worker-{i}"),
                 "--name", f"worker-{i}", "--memory-limit", memory_limit],
                f"worker-{i}",
            )  # fmt: skip
            state["worker_pids"].append(worker.pid)
        _write_state(state_dir, state)
        while _scheduler_workers(address, timeout) < workers:
            if time.monotonic() > deadline:
                raise ClusterError(f"only some of {workers} Dask workers started: see {state_dir}")
            time.sleep(0.5)
    except BaseException:
        stop(state_dir, state)
        raise
    finally:
        for log in logs:
            log.close()
    return state


def _write_state(state_dir: str, state: dict[str, Any]) -> None:
    from contract import atomic  # TensorFlow's import is left to the commands that write

    atomic.write_json_atomic(os.path.join(state_dir, STATE_FILE), state)


def stop(state_dir: str, state: dict[str, Any] | None = None, grace: float = 10.0) -> list[int]:
    """Ends the processes the cluster in `state_dir` started (workers first); returns their pids.

    Only pids that still run the dask role they were started as are signalled.
    """
    state = state or _read_state(state_dir)
    if not state:
        return []
    targets = [(pid, "worker") for pid in state.get("worker_pids", [])]
    targets.append((state["scheduler_pid"], "scheduler"))
    ended = []
    for pid, role in targets:
        if _alive_as_started(pid, role):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)  # its own session: the nanny and its worker
            ended.append(pid)
    deadline = time.monotonic() + grace
    for pid, role in targets:
        while _alive_as_started(pid, role) and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)
        if _alive_as_started(pid, role):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(state_dir, STATE_FILE))
    return ended


def main(argv: list[str] | None = None) -> int:
    """`start`, `stop` or `status`; prints the address (start), or one error line."""
    parser = argparse.ArgumentParser(prog="python -m preprocess.dask_cluster", description=__doc__)
    parser.add_argument("command", choices=["start", "stop", "status"])
    parser.add_argument("--workers", type=int, default=2, help="worker processes to start")
    parser.add_argument("--threads", type=int, default=1, help="threads per worker")
    parser.add_argument("--port", type=int, default=0, help="scheduler port (0: a free one)")
    parser.add_argument(
        "--memory-limit",
        default=DEFAULT_MEMORY_LIMIT,
        help="per worker; beyond 60-70%% of it a worker spills to disk",
    )
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help="pids, logs, addresses")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            state = start(
                args.workers, args.state_dir, args.port, args.threads,
                memory_limit=args.memory_limit,
            )  # fmt: skip
            print(state["address"])
        elif args.command == "stop":
            print(f"stopped {len(stop(args.state_dir))} processes")
        else:
            recorded = _read_state(args.state_dir)
            if not recorded or not _alive_as_started(recorded["scheduler_pid"], "scheduler"):
                print(error_line(f"no cluster from {args.state_dir} runs"), file=sys.stderr)
                return EXIT_FAILED
            workers = _scheduler_workers(recorded["address"], 30)
            print(f"{recorded['address']} with {workers} workers")
    except ClusterError as e:
        print(error_line(str(e)), file=sys.stderr)
        return EXIT_BAD_INPUT if "--workers" in str(e) else EXIT_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
