"""Runs a stage's command for a Luigi task: its log, its progress, its error line, its whole tree.

`run_stage(task, stage, command, log_path)` is how every task runs its stage. The command runs
as a local process, or for preprocess and evaluate with `[Executor] kind = docker` as a
`docker run` of the stages' image (the train task instead passes `--backend docker` to its
launcher, which stays a local process). Its output is appended to the stage's log (for a
gs:// log, to its local copy in the state folder, copied to the store when the stage ends), its
`PROGRESS {...}` lines become Luigi's progress percentage and status message (and an epoch line
in the terminal), its `NOTICE ...` lines are shown in the terminal, and a non-zero
exit raises `StageFailed` carrying the stage's own `error: ...` line (or the log's tail).

The task owns the stage's whole process tree. The command starts in its own process group
with a parent-death signal (SIGTERM, so the train launcher still stops its workers and
containers), and a group reaper in its own session holds the read end of a pipe only this
process writes: when this process dies in any way (SIGKILL included) the kernel closes the
pipe and the reaper ends the whole group, SIGTERM then SIGKILL, then removes the stage's
container (a `docker run` client killed before its container would leave it running). An
exception here (a failing task, or an interrupt) ends the group the same way before
re-raising, and stragglers left in the group after the stage exits are killed.

A night may be bounded (`stop_stages_at`, FullRun's `[FullRun] max_hours`): a stage still
running at the deadline has its group ended the same way (SIGTERM, then SIGKILL after
GROUP_GRACE_SECONDS) and fails with one line naming the bound, and no stage starts after it.
A stage writes its completion marker last, so the stopped stage is left unfinished, and a
rerun of the date resumes it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any

import luigi

from contract import gfile, run_lock, spawn, storage
from contract.containers import ContainerSettings
from contract.messages import last_error, parse_notice, parse_progress
from pipeline import docker_run
from pipeline.terminal import StageProgress, format_duration

logger = logging.getLogger("luigi-interface")

TAIL_LINES = 20
GROUP_GRACE_SECONDS = 60  # the train launcher stops its workers and containers in this time
# Waits for EOF on stdin (this process gone), then ends process group $1: TERM, then KILL;
# then removes the stage's container $2, if any (its client may have died before it).
GROUP_REAPER_SCRIPT = (
    'cat >/dev/null; if kill -TERM "-$1" 2>/dev/null; then i=0; '
    f'while [ $i -lt {GROUP_GRACE_SECONDS} ] && kill -0 "-$1" 2>/dev/null; '
    'do sleep 1; i=$((i+1)); done; kill -KILL "-$1" 2>/dev/null; fi; '
    '[ -z "$2" ] || docker rm -f "$2" >/dev/null 2>&1; exit 0'
)


class StageFailed(RuntimeError):
    """A stage command exited non-zero; the message is the stage's own error line.

    Attributes:
        stage: the stage's name (`train`).
        reason: one line: the stage's own error message, or its exit code and log.
    """

    def __init__(self, message: str, stage: str, reason: str) -> None:
        super().__init__(message)
        self.stage = stage
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Deadline:
    """When the stages of this run must have ended, and the setting that says so.

    Attributes:
        at: the time, on `time.monotonic()`'s clock (the same in forked luigi workers).
        setting: the bound as the operator set it (`[FullRun] max_hours=12`).
        seconds: the bound's length.
    """

    at: float
    setting: str
    seconds: float

    def exceeded(self, what: str) -> str:
        """The one-line reason of a stage the bound stopped (`what` it did to the stage)."""
        return (
            f"night exceeded {self.setting} ({format_duration(self.seconds)}): {what}; its "
            "outputs are left unfinished, and a rerun of the date resumes it"
        )


_deadline: Deadline | None = None


def stop_stages_at(deadline: Deadline | None) -> None:
    """Bounds every stage this process (and the luigi workers it forks) runs from now on:
    one still running at `deadline` is stopped, and none starts after it. None: no bound."""
    global _deadline
    _deadline = deadline


def run_stage(
    task: luigi.Task,
    stage: str,
    command: Sequence[str],
    log_path: str,
    container: ContainerSettings | None = None,
) -> None:
    """Runs `command` (in a `container` of the stages' image when given), logging to `log_path`.

    Raises:
        StageFailed: the stage exited non-zero; names its error line (or log tail) and log.
            Or the run's deadline passed (`stop_stages_at`): before the stage started, or
            while it ran, and its processes were stopped.
        ContainerError: `container` is given but Docker cannot run it.
    """
    deadline = _deadline
    if deadline is not None and time.monotonic() >= deadline.at:
        reason = deadline.exceeded(f"the {stage} stage was not started")
        StageProgress(stage).failed(reason)
        raise StageFailed(f"the {stage} stage did not start: {reason}", stage, reason)
    name = None
    if container is not None:
        command, name = docker_run.container_command(command, container)
    # An object store cannot be appended to: a remote log is written locally, copied at the end.
    local_log = storage.local_state_dir(log_path)
    os.makedirs(os.path.dirname(local_log) or ".", exist_ok=True)
    terminal = StageProgress(stage)
    terminal.start()
    with open(local_log, "ab") as log:
        log.write(f"$ {shlex.join(command)}\n".encode())
        log.flush()
        try:
            code, tail, error, stopped = _run_logged(
                task, list(command), log, name or "", terminal, deadline
            )
        finally:
            if name is not None:
                docker_run.remove_container_quietly(name)
    if local_log != log_path:
        _copy_log(local_log, log_path)
    if code != 0 and stopped and deadline is not None:
        ran = format_duration(time.monotonic() - terminal.started)
        reason = deadline.exceeded(f"the {stage} stage was stopped after {ran}")
        terminal.failed(reason)
        raise StageFailed(f"{reason} (exit {code}; log: {log_path})", stage, reason)
    if code != 0:
        reason = error or f"exit {code}; log: {log_path}"
        terminal.failed(reason)
        if error is not None:
            raise StageFailed(
                f"the {stage} stage failed: {error} (exit {code}; log: {log_path})", stage, reason
            )
        raise StageFailed(
            f"the {stage} stage exited with {code}; its log is {log_path}, ending:\n"
            + "\n".join(tail),
            stage,
            reason,
        )
    terminal.done()


def _copy_log(local_log: str, log_path: str) -> None:
    """Copies a stage's local log to its place on the store (a failed copy is only logged)."""
    try:
        gfile.makedirs(os.path.dirname(log_path))
        gfile.copy(local_log, log_path, overwrite=True)
    except (gfile.errors.OpError, OSError) as e:
        logger.warning("could not copy %s to %s: %s", local_log, log_path, e)


def _run_logged(
    task: luigi.Task,
    command: list[str],
    log: Any,
    container_name: str = "",
    terminal: StageProgress | None = None,
    deadline: Deadline | None = None,
) -> tuple[int, collections.deque[str], str | None, bool]:
    """Runs `command` as its own process group, copying its output to `log`.

    `container_name` names the stage's container, for the reaper to remove if this process dies.
    At `deadline` the group is ended (`_end_group`) from a timer thread.

    Returns:
        (exit code, the output's last lines, its last `error:` line or None, whether the
        deadline came while it ran).
    """
    env = os.environ | {"TF_USE_LEGACY_KERAS": "1", "PYTHONUNBUFFERED": "1"}
    # Forked from the warm fork server when one serves (contract.spawn), else its own process.
    process = spawn.popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,  # its own process group, ended as one
        death_signal=signal.SIGTERM,
        pass_fds=run_lock.held_fds(),  # the stage's tree holds the date's lock too
    )
    reaper, reaper_pipe = _start_group_reaper(process.pid, container_name)
    stopped = threading.Event()
    watchdog = None
    if deadline is not None:
        watchdog = threading.Timer(
            max(0.0, deadline.at - time.monotonic()), _stop_at_deadline, (process, stopped)
        )
        watchdog.daemon = True
        watchdog.start()
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    error = None
    try:
        assert process.stdout is not None
        for raw in process.stdout:
            log.write(raw)
            log.flush()
            line = raw.decode(errors="replace").rstrip("\r\n")
            tail.append(line)
            error = last_error([line]) or error
            progress = parse_progress(line)
            if progress is not None:
                report_progress(task, progress)
                if terminal is not None and "epoch" in progress and "epochs" in progress:
                    with contextlib.suppress(TypeError, ValueError):
                        terminal.epoch(progress)
            notice = parse_notice(line)
            if notice is not None and terminal is not None:
                terminal.notice(notice)
        code = process.wait()
    except BaseException:
        _end_group(process)
        raise
    finally:
        if watchdog is not None:
            watchdog.cancel()
        _kill_group(process.pid)  # stragglers outliving the stage
        reaper.kill()  # the group is gone: the reaper has nothing left to do
        reaper.wait()
        os.close(reaper_pipe)
    return code, tail, error, stopped.is_set()


def _stop_at_deadline(process: spawn.Process, stopped: threading.Event) -> None:
    """The deadline came while the stage ran: ends its whole group (the read loop then sees
    the stage's output end)."""
    if process.poll() is not None:
        return
    stopped.set()
    logger.warning("the run's deadline passed; stopping the stage's process group %d", process.pid)
    _end_group(process)


def report_progress(task: luigi.Task, progress: dict[str, Any]) -> None:
    """Shows a stage's progress line in Luigi: percentage from epoch/epochs, values as status.

    Outside a luigi worker (the task run by hand) there is nowhere to show it.
    """
    if not callable(task.set_progress_percentage) or not callable(task.set_status_message):
        return
    with contextlib.suppress(KeyError, TypeError, ValueError, ZeroDivisionError):
        task.set_progress_percentage(round(100 * progress["epoch"] / progress["epochs"]))
        values = ", ".join(
            f"{k} {v:.4f}" for k, v in progress.items() if k not in ("epoch", "epochs")
        )
        task.set_status_message(f"epoch {progress['epoch']}/{progress['epochs']}: {values}")


def _start_group_reaper(group: int, container_name: str) -> tuple[subprocess.Popen[bytes], int]:
    """Starts the reaper of `group` (and its container); returns it and its pipe's write end."""
    read_end, write_end = os.pipe()  # non-inheritable: only this process holds the write end
    try:
        reaper = subprocess.Popen(
            ["sh", "-c", GROUP_REAPER_SCRIPT, "group-reaper", str(group), container_name],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # not in the group it ends
        )
    finally:
        os.close(read_end)
    return reaper, write_end


def _end_group(process: spawn.Process) -> None:
    """SIGTERM to the stage's group, SIGKILL after GROUP_GRACE_SECONDS; waits for the stage."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(GROUP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        process.wait()


def _kill_group(group: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)
