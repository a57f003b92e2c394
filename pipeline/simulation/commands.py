"""The commands a simulated night runs as cron and an operator would: FullRun, status, rollback.

Each is a process of its own; a FullRun may be SIGKILLed at a chosen point.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from contract import layout, run_lock
from contract.messages import last_error
from pipeline.simulation import faults
from pipeline.simulation.config import Settings
from pipeline.simulation.disk import Disk
from train import cluster

# A night that takes longer than this is stopped and counts as hung.
NIGHT_TIMEOUT_SECONDS = 1800
POLL_SECONDS = 0.02
# How long a killed night's processes may take to let go of the date's lock (the stage's
# group is stopped SIGTERM first, with a grace of 60 s).
LOCK_RELEASE_SECONDS = 180
# Where a kill fault waits, and for what: the stage's log, and the line that says the stage is
# past its start (Train: its workers holding; Evaluate: the new model scored).
KILL_POINTS = {
    faults.KILL_TRAIN: ("Train", "train.log", cluster.HOLDING),
    faults.KILL_EVALUATE: ("Evaluate", "evaluate.log", "evaluate.stage: evaluated"),
}


@dataclasses.dataclass
class Attempt:
    """One process the simulation ran for a night.

    Attributes:
        date: the night.
        entry_point: `FullRun` or `rollback` (the ledger's name for it).
        pid: its process id (a FullRun's ledger record carries it).
        exit_code: its exit status (negative: the signal that ended it).
        seconds: its wall time.
        log: its output.
        killed_in: the stage a kill fault stopped it in (None: not killed).
        error: its last `error:` line, if any.
    """

    date: str
    entry_point: str
    pid: int
    exit_code: int
    seconds: float
    log: str
    killed_in: str | None = None
    error: str | None = None


# What the nights' processes read at import: the simulation's fork server starts with the same,
# or it could fork none of their stages (contract.forkserver).
IMPORT_TIME_ENV = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}


def environment(settings: Settings) -> dict[str, str]:
    """The nights' environment: the simulation's luigi.cfg, and loopback never proxied."""
    return (
        os.environ
        | IMPORT_TIME_ENV
        | {
            "LUIGI_CONFIG_PATH": settings.config_path,
            "PYTHONUNBUFFERED": "1",
            "no_proxy": "127.0.0.1,localhost",
            "NO_PROXY": "127.0.0.1,localhost",
        }
    )


def _log_path(settings: Settings, date: str, what: str) -> str:
    os.makedirs(settings.logs, exist_ok=True)
    number = 1
    while os.path.exists(os.path.join(settings.logs, f"{date}-{what}-{number}.log")):
        number += 1
    return os.path.join(settings.logs, f"{date}-{what}-{number}.log")


def full_run(
    settings: Settings, disk: Disk, date: str, extra: tuple[str, ...] = (), kill: str | None = None
) -> Attempt:
    """Runs `python -m pipeline FullRun --local-scheduler --date D` in the simulation's folder,
    in a process group of its own; with `kill` (a KILL_POINTS fault) SIGKILLs the group once the
    stage's log shows that point, and waits until nothing holds the date's lock any more.

    Raises:
        TimeoutError: the night ran past NIGHT_TIMEOUT_SECONDS, or its processes kept the
            date's lock past LOCK_RELEASE_SECONDS after the kill.
    """
    command = [sys.executable, "-m", "pipeline", "FullRun", "--local-scheduler", f"--date={date}"]
    log_path = _log_path(settings, date, "FullRun")
    stage_log = None
    if kill is not None:
        stage, name, _ = KILL_POINTS[kill]
        stage_log = os.path.join(layout.logs_dir(settings.output_root, date), name)
    hold = {}
    if kill == faults.KILL_TRAIN:
        # Killed while its workers hold at the first step of the second epoch (train.callbacks;
        # the first when it trains one epoch): after the first epoch's backups, on a machine of
        # any speed, where a kill after the first epoch's line could land after training ended.
        hold = {cluster.HOLD_ENV: "epoch-2" if settings.epochs > 1 else "1"}
    start_offset = os.path.getsize(stage_log) if stage_log and os.path.exists(stage_log) else 0
    started = time.monotonic()
    with open(log_path, "w") as log:
        log.write(f"$ {' '.join(command + list(extra))}\n")
        log.flush()
        process = subprocess.Popen(
            disk.command(command + list(extra)),
            cwd=settings.root,
            env=environment(settings) | hold,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as cron's shell gives it
        )
        killed_in = None
        if kill is not None and _wait_for(process, stage_log, start_offset, KILL_POINTS[kill][2]):
            os.killpg(process.pid, signal.SIGKILL)
            killed_in = KILL_POINTS[kill][0]
        try:
            code = process.wait(timeout=NIGHT_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise TimeoutError(f"{date}'s FullRun ran past {NIGHT_TIMEOUT_SECONDS} s") from None
    if killed_in is not None:
        _wait_for_lock(settings.output_root, date)
    return Attempt(
        date=date,
        entry_point="FullRun",
        pid=process.pid,
        exit_code=code,
        seconds=time.monotonic() - started,
        log=log_path,
        killed_in=killed_in,
        error=_error_of(log_path),
    )


def _wait_for(process: subprocess.Popen[bytes], path: str | None, offset: int, text: str) -> bool:
    """Waits until `text` is in `path` past `offset` (True) or the process ends (False)."""
    wanted, seen = text.encode(), b""
    while path is not None and process.poll() is None:
        if os.path.exists(path):
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            seen = (seen + chunk)[-4096:]
            if wanted in seen:
                return True
        time.sleep(POLL_SECONDS)
    return False


def _wait_for_lock(output_root: str, date: str) -> None:
    """Waits until the killed night's date lock can be taken: its luigi process is gone and so
    is every stage process that inherited the lock (a launcher or worker ending after its
    SIGTERM grace); the next attempt would be refused before then."""
    run_dir = layout.run_dir(output_root, date)
    deadline = time.monotonic() + LOCK_RELEASE_SECONDS
    while not run_lock.is_free(run_dir):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{LOCK_RELEASE_SECONDS} s after {date}'s FullRun was killed, its processes "
                "still hold the date's lock"
            )
        time.sleep(POLL_SECONDS)


def _error_of(log_path: str) -> str | None:
    with open(log_path, errors="replace") as f:
        return last_error(f.read().splitlines())


def status(settings: Settings, date: str) -> tuple[int, dict[str, Any]]:
    """`python -m pipeline status --json` as a monitor runs it on `date`'s morning.

    Returns:
        Its exit status and its JSON document ({} when it printed none).
    """
    command = [
        sys.executable, "-m", "pipeline", "status", f"--output-root={settings.output_root}",
        f"--today={date}", "--nights=3", "--json",
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=settings.root, env=environment(settings), capture_output=True, text=True
    )
    with open(_log_path(settings, date, "status"), "w") as log:
        log.write(f"$ {' '.join(command)}\n{done.stdout}{done.stderr}")
    try:
        document = json.loads(done.stdout)
    except ValueError:
        document = {}
    return done.returncode, document if isinstance(document, dict) else {}


def rollback(settings: Settings, to_date: str, reason: str) -> Attempt:
    """`python -m pipeline rollback --to DATE`, as an operator runs it."""
    command = [
        sys.executable, "-m", "pipeline", "rollback", f"--to={to_date}",
        f"--output-root={settings.output_root}", f"--reason={reason}",
    ]  # fmt: skip
    log_path = _log_path(settings, to_date, "rollback")
    started = time.monotonic()
    with open(log_path, "w") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        done = subprocess.run(
            command,
            cwd=settings.root,
            env=environment(settings),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return Attempt(
        date=to_date,
        entry_point="rollback",
        pid=0,
        exit_code=done.returncode,
        seconds=time.monotonic() - started,
        log=log_path,
        error=_error_of(log_path),
    )
