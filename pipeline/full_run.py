"""`FullRun`: the nightly entry point, Preprocess -> Train -> Evaluate for one date.

    luigi --module pipeline FullRun --local-scheduler                  # today, as cron runs it
    luigi --module pipeline FullRun --date 2026-01-31 --force-stage train

When there is anything to do, FullRun first takes the date's lock (a second run of the same
date is refused), sends the luigi log to `<run>/logs/`, and with `--force-stage` moves that
stage's outputs and its dependants' into `<run>/superseded/<timestamp>/` so they rerun.
"""

from __future__ import annotations

import datetime
import logging
import os

import luigi

from contract import layout
from pipeline import run_lock, supersede
from pipeline.evaluate_task import Evaluate
from pipeline.params import RunTask

logger = logging.getLogger("luigi-interface")


class FullRun(RunTask, luigi.WrapperTask):
    """The whole pipeline for one date; complete when the run's metrics.json exists."""

    force_stage = luigi.OptionalChoiceParameter(
        default=None,
        choices=supersede.STAGES,
        description="Rerun this stage and every stage after it: their outputs are moved to "
        "<run>/superseded/<timestamp>/ (never deleted). Empty: rerun only what is missing.",
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._prepared = False

    def requires(self) -> luigi.Task:
        return Evaluate(**self.shared_params())

    def complete(self) -> bool:
        # luigi asks this first, before scheduling anything: the moment to claim the date.
        if self._prepared or (self.force_stage is None and super().complete()):
            return super().complete()
        run_dir = layout.run_dir(self.output_root, self.date_str)
        if run_lock.hold_for_process(run_dir):
            _log_to_run_folder(self.output_root, self.date_str)
            logger.info("holding the lock of %s for this run", run_dir)
        if self.force_stage is not None:
            supersede.supersede(self.output_root, self.date_str, self.force_stage)
        self._prepared = True
        return super().complete()


def _log_to_run_folder(output_root: str, date: str) -> str:
    """Copies luigi's and this package's log records into `<run>/logs/luigi-<timestamp>.log`.

    For a remote output_root the file goes to the local `logs/<date>/` folder instead.
    """
    logs = layout.logs_dir(output_root, date)
    if "://" in logs:
        logs = os.path.join("logs", date)
    os.makedirs(logs, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = layout.join(logs, f"luigi-{stamp}-pid{os.getpid()}.log")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    # luigi logs to 'luigi-interface' (and a few modules to 'luigi'); this package to 'pipeline'.
    for name in ("luigi-interface", "luigi", "pipeline"):
        logging.getLogger(name).addHandler(handler)
    if logging.getLogger("pipeline").getEffectiveLevel() > logging.INFO:
        logging.getLogger("pipeline").setLevel(logging.INFO)
    return path
