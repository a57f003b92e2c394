"""`FullRun`: the nightly entry point, Preprocess -> Train -> Evaluate for one date.

    luigi --module pipeline FullRun --local-scheduler                  # today, as cron runs it
    luigi --module pipeline FullRun --date 2026-01-31 --force-stage train

Before anything is scheduled, FullRun refuses bad parameters of any stage, and a date whose
shard set was made with other Preprocess parameters, or whose training finished with other
Train parameters, than this run's (either would otherwise count as done); and, when there is
anything to do, takes the date's lock (a second run of the same date is refused), sends the
luigi log to `<run>/logs/`, and with `--force-stage` moves that stage's outputs and its
dependants' into `<run>/superseded/<timestamp>/` so they rerun (`prepare_run`). From then on
the night is bounded by `max_hours`: a stage still running when it is up is stopped, whole
process tree, and fails the night with one line naming the bound (`pipeline.runner`). As the
attempt ends (and was not refused), what luigi.cfg's [Retention] lets go of the output root is
removed and listed in its ledger record (`pipeline.retention`).
"""

from __future__ import annotations

import atexit
import datetime
import logging
import math
import os
import subprocess
import sys
import time
from typing import Any

import luigi

from contract import gfile, import_path, layout, run_lock, storage
from contract.messages import EXIT_BAD_INPUT, error_line
from pipeline import attempts, retention, retention_config, runner, supersede
from pipeline.data_gate_task import DataGate
from pipeline.evaluate_task import Evaluate
from pipeline.finished_settings import (
    ShardSetMismatch,
    TrainSettingsMismatch,
    check_shard_set_parameters,
    check_train_settings,
    printed,
)
from pipeline.params import BadParameterExit, RunTask, check_output_root, refuse_bad_parameters
from pipeline.preprocess_task import Preprocess
from pipeline.train_task import Train

logger = logging.getLogger("luigi-interface")


class RefusalTraceback(logging.Filter):
    """Drops luigi's warning and traceback for a refusal raised in a task's complete(): the
    refusal has printed its one `error: ...` line already, and luigi's summary and exit code
    (35, scheduling_error) say the rest."""

    REFUSALS = (
        ShardSetMismatch,
        TrainSettingsMismatch,
        run_lock.RunLockedError,
        storage.UnsupportedStorageError,
        import_path.ImportPathError,
    )

    # How a traceback's last line begins for each of them.
    NAMES = tuple(f"{cls.__module__}.{cls.__qualname__}:" for cls in REFUSALS)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "error in complete() method" not in message:
            return True
        return not message.rstrip().rsplit("\n", 1)[-1].startswith(self.NAMES)


logger.addFilter(RefusalTraceback())


DEFAULT_MAX_HOURS = 12.0


def checked_hours(value: Any) -> float | None:
    """A night's bound in hours: a number above 0, or None (empty) for no bound; anything
    else stops the program with one `error: ...` line and exit 2, before anything runs."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        hours = float(value)
    except (TypeError, ValueError):
        hours = math.nan
    if not (math.isfinite(hours) and hours > 0):
        print(
            error_line(
                f"[FullRun] max_hours must be a number of hours above 0 (fractions are fine: "
                f"0.5), or empty for no bound; got {value!r}"
            ),
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(EXIT_BAD_INPUT)
    return hours


class OptionalHoursParameter(luigi.OptionalFloatParameter):
    """Hours above 0, or empty; a bad value is refused in one line, exit 2 (`checked_hours`)."""

    def parse(self, x: Any) -> float | None:
        return checked_hours(x)

    def normalize(self, x: Any) -> float | None:
        return checked_hours(x)


class FullRun(RunTask, luigi.WrapperTask):
    """The whole pipeline for one date; complete when the run's metrics.json exists."""

    force_stage = luigi.OptionalChoiceParameter(
        default=None,
        choices=supersede.STAGES,
        description="Rerun this stage and every stage after it: their outputs are moved to "
        "<run>/superseded/<timestamp>/ (removed [Retention] superseded_days later). Empty: rerun "
        "only what is missing.",
    )
    max_hours = OptionalHoursParameter(
        default=DEFAULT_MAX_HOURS,
        description="The longest a night may run, in hours from its start (fractions allowed): "
        "a stage still running then is stopped with its whole process tree and the night "
        "fails, naming this bound; a rerun of the date resumes it. Empty: no bound.",
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._prepared = False

    def requires(self) -> luigi.Task:
        return Evaluate(**self.shared_params())

    def check_complete(self) -> bool:
        # Why the preparation runs here: luigi's worker asks the root task's complete() first,
        # before it calls any requires() or any dependency's complete(), and every later hook
        # (run(), the START/SUCCESS events) fires only after Preprocess', Train's and
        # Evaluate's completeness has been decided. Superseding a forced stage, refusing a
        # mismatched shard set or taking the lock any later would come after luigi has already
        # counted that stage as done (or started it unlocked). `_prepared` makes it happen once
        # however often luigi asks; with `--workers N` the check still runs in this process
        # (parallel_scheduling stays off, its default), so the lock stays held here.
        if not self._prepared:
            check_output_root(self.output_root)
            # Every stage's parameters and [Retention], before anything is superseded, locked
            # or run.
            refuse_bad_parameters(
                Preprocess(**self.shared_params()),
                DataGate(**self.shared_params()),
                Train(**self.shared_params()),
                Evaluate(**self.shared_params()),
            )
            self._retain_after(refuse_bad_retention_settings())
            self._prepared = True
            self._bound_stages()
            prepare_run(Preprocess(**self.shared_params()), self.force_stage)
        return super().check_complete()

    def _bound_stages(self) -> None:
        """Has every stage of this run stop at `max_hours` from now (none: unbounded)."""
        if self.max_hours is None:
            runner.stop_stages_at(None)
            return
        seconds = self.max_hours * 3600
        setting = f"[FullRun] max_hours={self.max_hours:g}"
        runner.stop_stages_at(runner.Deadline(time.monotonic() + seconds, setting, seconds))

    def _retain_after(self, settings: retention_config.Settings) -> None:
        """Has the attempt end with a retention pass of this run's output root and served
        model (`pipeline.attempts.finish` runs it and records what it removed)."""
        evaluate = Evaluate(**self.shared_params()).param_kwargs  # its export base and name
        target = retention.target_of(
            self.output_root, evaluate["export_base"], evaluate["model_name"]
        )
        attempts.run_retention_after(lambda: retention.run_pass(target, settings).record())


def refuse_bad_retention_settings() -> retention_config.Settings:
    """[Retention]'s settings; an unknown key or a bad value stops the program with the stages'
    one error line and exit 2, before anything runs."""
    try:
        return retention_config.checked_settings()
    except retention_config.RetentionSettingsError as e:
        print(error_line(str(e)), file=sys.stderr, flush=True)
        raise BadParameterExit(str(e)) from None


def prepare_run(preprocess: Preprocess, force_stage: str | None = None) -> None:
    """Gets a date ready to be scheduled: checks, locks, logs and supersedes, as needed.

    Raises:
        ShardSetMismatch: the date's shard set was made with other parameters (and is not
            being forced to rerun).
        RunLockedError: another process is running the date.
    """
    output_root, date = preprocess.output_root, preprocess.date_str
    if force_stage != "preprocess":
        check_shard_set_parameters(preprocess)
    if force_stage not in ("preprocess", "train"):
        check_train_settings(Train(**preprocess.shared_params()))
    if force_stage is None and Evaluate(**preprocess.shared_params()).complete():
        return  # nothing to do: no lock, no log file, nothing touched
    run_dir = layout.run_dir(output_root, date)
    try:
        held = run_lock.hold_for_process(run_dir)
    except run_lock.RunLockedError as e:
        raise printed(e) from None
    if held:
        _log_to_run_folder(output_root, date)
        logger.info("holding the lock of %s for this run", run_dir)
    if force_stage is not None:
        supersede.supersede(output_root, date, force_stage)
        rewrite_trend_page(output_root)


def rewrite_trend_page(output_root: str) -> None:
    """Rewrites the nightly trend page after a forced stage moved a night's evaluation aside,
    so the page never shows the superseded evaluation as current while the date reruns.

    The evaluate stage owns the page; this runs its command. A failure only warns: the
    rerun's Evaluate rewrites the page again when it finishes.
    """
    command = [sys.executable, "-m", "evaluate.rewrite_trend", "--output-root", output_root]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        logger.warning(
            "could not rewrite the trend page (exit %d): %s",
            done.returncode,
            (done.stderr.strip().splitlines() or [""])[-1],
        )


def _log_to_run_folder(output_root: str, date: str) -> str:
    """Copies luigi's and this package's log records into `<run>/logs/luigi-<timestamp>.log`.

    For a remote output_root the file is written in the run's local state folder
    (`contract.storage.local_state_dir`) and copied to `<run>/logs/` when this process exits.
    """
    logs = layout.logs_dir(output_root, date)
    local_logs = storage.local_state_dir(logs)
    os.makedirs(local_logs, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    name = f"luigi-{stamp}-pid{os.getpid()}.log"
    path = os.path.join(local_logs, name)
    if storage.is_remote(logs):
        atexit.register(_upload_log, path, layout.join(logs, name))
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    # luigi logs to 'luigi-interface' (and a few modules to 'luigi'); this package to 'pipeline'.
    for name in ("luigi-interface", "luigi", "pipeline"):
        logging.getLogger(name).addHandler(handler)
    if logging.getLogger("pipeline").getEffectiveLevel() > logging.INFO:
        logging.getLogger("pipeline").setLevel(logging.INFO)
    return path


def _upload_log(local_path: str, remote_path: str) -> None:
    """Copies the luigi log to the store; a failed copy is reported, never raised at exit."""
    try:
        gfile.copy(local_path, remote_path, overwrite=True)
    except Exception as e:  # noqa: BLE001 - at exit, a lost log copy must not hide the run's result
        logger.warning("could not copy the luigi log %s to %s: %s", local_path, remote_path, e)
