"""Records each attempt of a luigi entry point (FullRun, or one stage task) in the run ledger.

The attempt begins when luigi first asks the command line's root task whether it is complete
(before anything is scheduled, so refusals count), and files its start record then
(`contract.ledger.begin`: an attempt killed before its end reads back as failed, "ended without
a record"). It learns from luigi's events which stage ran, for how long and how it ended, and
its record is written to `contract.ledger` once, when the run ends: from `pipeline.__main__`
after luigi returns, or at the process's exit under the `luigi` command. Just before, the
alerts its outcome calls for are sent (`pipeline.night_alerts`) and listed in the record, and,
for a FullRun that was not refused, the retention pass it registered (`run_retention_after`)
removes what [Retention] lets go and is recorded as `retention`. None of them ever changes the
run's result: a failure is a warning, or an entry of the record.

Stage figures come from the process that ran the task: with luigi's `--workers N` (N > 1) the
tasks run in forked processes, and the record keeps only the outcome.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import importlib.metadata
import logging
import os
import resource
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import luigi
from luigi.cmdline_parser import CmdlineParser

from contract import atomic, gfile, layout, ledger, run_lock, spawn, storage
from pipeline import night_alerts, notify
from pipeline.runner import StageFailed

logger = logging.getLogger("luigi-interface")

# Distributions whose versions each record carries: name in the record -> installed names.
PACKAGES = {
    "tensorflow": ("tensorflow", "tensorflow-cpu"),
    "apache-beam": ("apache-beam",),
    "luigi": ("luigi",),
    "tf-keras": ("tf-keras",),
    "nightly-trainer": ("nightly-trainer",),
}
PROJECT_ROOT = Path(__file__).resolve().parents[1]
# Entry points whose success leaves the night's blessing verdict.
VERDICT_ENTRY_POINTS = ("FullRun", "Evaluate")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")


def _cpu_seconds(who: int = resource.RUSAGE_CHILDREN) -> float:
    usage = resource.getrusage(who)
    # Programs the fork server forked are its children, not ours: it reports their usage.
    forked = spawn.forked_usage()[0] if who == resource.RUSAGE_CHILDREN else 0.0
    return usage.ru_utime + usage.ru_stime + forked


def _all_cpu_seconds() -> float:
    return _cpu_seconds(resource.RUSAGE_SELF) + _cpu_seconds(resource.RUSAGE_CHILDREN)


def one_line(error: BaseException | str) -> str:
    """An error as one line; a stage's failure as the stage's own error line."""
    if isinstance(error, StageFailed):
        return error.reason
    return " ".join(str(error).split()) or type(error).__name__


@dataclasses.dataclass
class Attempt:
    """What is known so far of one attempt of an entry point."""

    task_id: str
    entry_point: str
    date: str
    output_root: str
    attempt_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    started_utc: str = dataclasses.field(default_factory=_now)
    started: float = dataclasses.field(default_factory=time.monotonic)
    cpu_at_start: float = dataclasses.field(default_factory=_all_cpu_seconds)
    bytes_at_start: int | None = None
    outcome: str | None = None  # refused or failed once known; skipped-complete
    stage: str | None = None
    reason: str | None = None
    succeeded: bool = False
    stages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    running: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    # The alert channels as the run's command line and luigi.cfg gave them (None: unreadable).
    alert_settings: notify.Settings | None = None
    # FullRun's retention pass, run as the attempt finishes: returns its ledger entry.
    retention: Callable[[], dict[str, Any]] | None = None
    # The start record's file or object (None until it is written).
    start_record: str | None = None

    @property
    def writable(self) -> bool:
        """Whether the output root is one the ledger can be written to (not s3://, say)."""
        try:
            storage.check_supported(self.output_root)
        except storage.UnsupportedStorageError:
            return False
        return True

    def run_dir(self) -> str:
        return layout.run_dir(self.output_root, self.date)

    def stopped(self, outcome: str, stage: str, error: BaseException | str) -> None:
        """Notes the first refusal or failure; later ones follow from it."""
        if self.outcome is None:
            self.outcome, self.stage, self.reason = outcome, stage, one_line(error)

    def stage_started(self, task: luigi.Task) -> None:
        self.running[task.task_id] = (time.monotonic(), _cpu_seconds())

    def stage_ended(self, task: luigi.Task, outcome: str) -> None:
        started, cpu = self.running.pop(task.task_id, (None, 0.0))
        if started is None or isinstance(task, luigi.WrapperTask):
            return
        self.stages.append(
            {
                "stage": task.task_family,
                "outcome": outcome,
                "wall_seconds": round(time.monotonic() - started, 3),
                "cpu_seconds": round(_cpu_seconds() - cpu, 3),
            }
        )

    def bytes_written(self) -> int | None:
        """How much the date's folder grew during the attempt (None when it cannot be read)."""
        now = _folder_bytes(self.run_dir())
        if now is None or self.bytes_at_start is None:
            return None
        return now - self.bytes_at_start

    def final_outcome(self) -> str:
        if self.outcome is not None:
            return self.outcome
        if not self.succeeded:
            self.stopped(
                ledger.FAILED,
                self.entry_point,
                f"{self.entry_point} did not complete; luigi's execution summary says why",
            )
            return ledger.FAILED
        if self.entry_point in VERDICT_ENTRY_POINTS:
            path = layout.join(
                layout.evaluate_dir(self.output_root, self.date), layout.BLESSING_FILE
            )
            errors: tuple[type[BaseException], ...] = (*gfile.file_errors(), ValueError)
            try:
                blessed = dict(atomic.read_json(path)).get("blessed")
            except errors:
                blessed = None
            if isinstance(blessed, bool):
                return ledger.BLESSED if blessed else ledger.NOT_BLESSED
        return ledger.SUCCEEDED

    def identity(self) -> dict[str, Any]:
        """What the start record and the end record both say of the attempt."""
        return {
            "attempt_id": self.attempt_id,
            "date": self.date,
            "entry_point": self.entry_point,
            "started_utc": self.started_utc,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "command": " ".join(sys.argv),
        }

    def record(self) -> dict[str, Any]:
        """The ledger record of the attempt, as it stands now."""
        outcome = self.final_outcome()
        peak_kib = max(
            *(
                resource.getrusage(who).ru_maxrss
                for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
            ),
            spawn.forked_usage()[1],
        )
        return self.identity() | {
            "ended_utc": _now(),
            "outcome": outcome,
            "stage": self.stage,
            "reason": self.reason,
            "wall_seconds": round(time.monotonic() - self.started, 3),
            "cpu_seconds": round(_all_cpu_seconds() - self.cpu_at_start, 3),
            "stages": self.stages,
            "peak_rss_bytes": peak_kib * 1024,  # the largest process of the attempt
            "bytes_written": self.bytes_written(),
            "versions": package_versions(),
            "git_revision": git_revision(),
        }


def _folder_bytes(path: str) -> int | None:
    """The size of the files under `path`, or None (with a warning) when it cannot be read."""
    try:
        return ledger.folder_bytes(path)
    except Exception as e:  # noqa: BLE001 - one figure of the record, never the run's failure
        logger.warning("could not measure %s for the run ledger: %s", path, one_line(e))
        return None


def package_versions() -> dict[str, str | None]:
    """The installed versions of PACKAGES (None for one that is not installed)."""
    versions: dict[str, str | None] = {}
    for name, distributions in PACKAGES.items():
        versions[name] = None
        for distribution in distributions:
            try:
                versions[name] = importlib.metadata.version(distribution)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return versions


def git_revision(project_root: Path = PROJECT_ROOT) -> str | None:
    """The commit the project's git checkout is at; None when it is not a checkout."""
    if not (project_root / ".git").exists():
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(project_root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


_current: Attempt | None = None
_exit_hook_registered = False


def _is_root(task: luigi.Task) -> bool:
    """Whether `task` is the task luigi's command line asked for (not luigi.build's, not a
    dependency)."""
    parser = CmdlineParser.get_instance()
    if parser is None:
        return False
    try:
        return bool(parser.get_task_obj().task_id == task.task_id)
    except Exception:  # noqa: BLE001 - a command line luigi could not parse runs no attempt
        return False


def _begin(task: luigi.Task) -> Attempt | None:
    """Begins the attempt when `task` is the command line's root task and none has begun."""
    global _current, _exit_hook_registered
    if _current is not None or not _is_root(task):
        return None
    attempt = Attempt(
        task_id=task.task_id,
        entry_point=task.task_family,
        # A run task's (pipeline.params.RunTask); read by name, which keeps this module below it.
        date=str(getattr(task, "date_str")),  # noqa: B009
        output_root=str(getattr(task, "output_root")),  # noqa: B009
    )
    if attempt.writable:
        attempt.bytes_at_start = _folder_bytes(attempt.run_dir())
        try:
            attempt.start_record = ledger.begin(attempt.output_root, attempt.identity())
        except Exception as e:  # noqa: BLE001 - the ledger must never fail the night
            logger.warning(
                "could not write the attempt's start to the run ledger under %s: %s",
                attempt.output_root,
                one_line(e),
            )
    # Read now: luigi's command-line values are gone once luigi returns. Settings that cannot
    # be read are refused by the parameter checks that follow.
    with contextlib.suppress(notify.NotifySettingsError):
        attempt.alert_settings = notify.current_settings()
    _current = attempt
    if not _exit_hook_registered:
        atexit.register(finish)  # under the `luigi` command, nothing runs after luigi
        _exit_hook_registered = True
    return attempt


def observe_complete(task: luigi.Task, check: Callable[[], bool]) -> bool:
    """`check()`, luigi's completeness check of `task`, watched for the ledger.

    The root task's first check begins the attempt; an exception from any check (a refusal:
    a locked date, a shard set made with other settings, a bad parameter's exit) marks the
    attempt refused, and a root already complete marks it skipped-complete.
    """
    began = _begin(task)
    try:
        done = check()
    except (Exception, SystemExit) as e:
        if _current is not None:
            _current.stopped(ledger.REFUSED, task.task_family, e)
        raise
    if began is not None and done:
        began.outcome = ledger.SKIPPED_COMPLETE
    return done


def listen(task_class: type[luigi.Task]) -> None:
    """Registers the ledger's handlers of luigi's events on `task_class` and its subclasses."""

    @task_class.event_handler(luigi.Event.START)
    def started(task: luigi.Task) -> None:
        if _current is not None:
            _current.stage_started(task)

    @task_class.event_handler(luigi.Event.SUCCESS)
    def succeeded(task: luigi.Task) -> None:
        if _current is not None:
            _current.stage_ended(task, ledger.SUCCEEDED)
            if task.task_id == _current.task_id:
                _current.succeeded = True

    @task_class.event_handler(luigi.Event.FAILURE)
    def failed(task: luigi.Task, error: BaseException) -> None:
        if _current is not None:
            locked = isinstance(error, run_lock.RunLockedError)  # a stage alone takes it in run()
            outcome = ledger.REFUSED if locked else ledger.FAILED
            _current.stage_ended(task, outcome)
            _current.stopped(outcome, task.task_family, error)

    @task_class.event_handler(luigi.Event.PROCESS_FAILURE)
    @task_class.event_handler(luigi.Event.TIMEOUT)
    def died(task: luigi.Task, message: str) -> None:
        if _current is not None:
            _current.stopped(ledger.FAILED, task.task_family, message)


def run_retention_after(retention_pass: Callable[[], dict[str, Any]]) -> None:
    """Has the attempt under way run `retention_pass` as it finishes, unless it was refused;
    what it returns is the record's `retention`. No attempt under way: nothing."""
    if _current is not None:
        _current.retention = retention_pass


def _retention(attempt: Attempt, outcome: str) -> dict[str, Any] | None:
    """The attempt's retention pass and its entry (None when it has none, or was refused)."""
    if attempt.retention is None or outcome == ledger.REFUSED:
        return None
    try:
        return attempt.retention()
    except Exception as e:  # noqa: BLE001 - retention never fails the night
        logger.warning("retention did not run: %s; the run's result is unchanged", one_line(e))
        return {
            "dry_run": False,
            "removed": [],
            "bytes_freed": 0,
            "errors": [{"path": None, "error": one_line(e)}],
        }


def finish() -> dict[str, Any] | None:
    """Sends the alerts the attempt calls for (`night_alerts.attempt_alerts`), runs its
    retention pass, then writes its record, with them as `alerts` and `retention`, to the
    ledger, once; a failure of any only warns.

    Returns:
        The record, or None when no attempt was under way (or its root cannot hold a ledger).
    """
    global _current
    attempt, _current = _current, None
    if attempt is None or not attempt.writable:
        return None
    try:
        record = attempt.record()
        record["alerts"] = (
            night_alerts.attempt_alerts(attempt.output_root, record, attempt.alert_settings)
            if attempt.alert_settings is not None
            else []
        )
        retention = _retention(attempt, record["outcome"])
        if retention is not None:
            record["retention"] = retention
        ledger.append(attempt.output_root, record, replaces=attempt.start_record)
    except Exception as e:  # noqa: BLE001 - the ledger must never fail the night
        logger.warning(
            "could not write the run ledger under %s: %s; the run's result is unchanged",
            attempt.output_root,
            one_line(e),
        )
        return None
    return record
