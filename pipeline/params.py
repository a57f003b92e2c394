"""Parameters every stage's task shares; their values come from luigi.cfg's [Preprocess] section.

Train and Evaluate must agree with the shard set they read, so their shared parameters fall
back to [Preprocess] (luigi's `config_path`) instead of repeating the values per section.
"""

from __future__ import annotations

import datetime
import sys

import luigi
from luigi.parameter import ConfigPath

from contract import dates, layout, run_lock, settings, storage
from contract.messages import EXIT_BAD_INPUT, error_line
from pipeline import attempts, config, config_file, failure_email, notify
from pipeline.stage_params import parameter_for
from preprocess.config import PreprocessConfig


def _from_preprocess(name: str) -> ConfigPath:
    return {"section": "Preprocess", "name": name}


_PREPROCESS = {s.name: s for s in settings.settings_of(PreprocessConfig)}


class RunDateParameter(luigi.DateParameter):
    """A run's date, exactly `YYYY-MM-DD` (luigi's own also takes `2026-1-5`).

    luigi parses the command line and luigi.cfg before any task exists, and a ValueError there
    is a traceback; a date that is not a calendar date `YYYY-MM-DD` stops the program here with
    the stages' one error line and exit 2 instead, before anything runs.
    """

    def parse(self, s: str) -> datetime.date:
        try:
            return dates.parse(s, "--date")
        except dates.DateError as e:
            print(error_line(str(e)), file=sys.stderr, flush=True)
            raise SystemExit(EXIT_BAD_INPUT) from None


class RunTask(luigi.Task):
    """Base of the stage tasks: the run's date, where it writes, the dataset and worker count."""

    date = RunDateParameter(
        default=datetime.date.today(),
        description="The run's date; outputs go under <output_root>/<date>/.",
    )
    output_root = luigi.Parameter(
        default="runs",
        config_path=_from_preprocess("output_root"),
        description="Folder (local path or gs:// URL) holding one subfolder per run date; "
        "other schemes (s3://...) are refused before anything runs.",
    )
    # The stages' own settings that every task shares, as preprocess declares them.
    dataset = parameter_for(_PREPROCESS["dataset"], _from_preprocess("dataset"))
    num_workers = parameter_for(_PREPROCESS["num_workers"], _from_preprocess("num_workers"))

    def complete(self) -> bool:
        # Every check is watched for the run ledger: the command line's root task begins the
        # attempt, and a refusal raised here is recorded before luigi reports it.
        return attempts.observe_complete(self, self.check_complete)

    def check_complete(self) -> bool:
        """Whether the task's output exists; subclasses add their checks (and refusals).

        luigi asks the task it was started with before anything else runs: an unsupported
        output root or a parameter the stage would refuse stops the run here, with the stages'
        own error line.
        """
        check_output_root(self.output_root)
        refuse_bad_parameters(self)
        return bool(super().complete())

    def on_failure(self, exception: BaseException) -> str:
        """What luigi reports of the failure, in its scheduler and its failure e-mail: the
        stage's one-line error first, then luigi's traceback."""
        details = str(super().on_failure(exception))
        return failure_email.explanation(attempts.one_line(exception), details)

    def check_parameters(self) -> None:
        """Refuses parameter values the stage would refuse; the stage tasks say which.

        Raises:
            ValueError: naming the parameter and its allowed values.
        """

    def shared_params(self) -> dict:
        """The shared parameter values, to pass on to the task this one requires."""
        return {
            "date": self.date,
            "output_root": self.output_root,
            "dataset": self.dataset,
            "num_workers": self.num_workers,
        }

    @property
    def date_str(self) -> str:
        return self.date.isoformat()

    def hold_run_lock(self) -> None:
        """Takes the date's lock (held already under FullRun) before the stage writes.

        Raises:
            RunLockedError: another run of the date is in progress.
        """
        run_lock.hold_for_process(layout.run_dir(self.output_root, self.date_str))


attempts.listen(RunTask)
failure_email.install()


class BadParameterExit(SystemExit):
    """Exit 2 after a parameter was refused in one printed line; `str()` is that refusal."""

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_BAD_INPUT)
        self.message = message

    def __str__(self) -> str:
        return self.message


def refuse_bad_parameters(*tasks: RunTask) -> None:
    """Stops the program, with the stages' one error line and exit 2, when a task's parameters
    are out of range: while luigi decides what to run, so nothing has run yet (a threshold of
    the last stage is not found wrong after the hours of training before it). A run without
    a configuration (pipeline.config_file) and the alert settings ([Notify]) are checked first.
    """
    if config_file.problem is not None:
        print(error_line(config_file.problem), file=sys.stderr, flush=True)
        raise BadParameterExit(config_file.problem)
    try:
        notify.check_settings()
    except notify.NotifySettingsError as e:
        print(error_line(str(e)), file=sys.stderr, flush=True)
        raise BadParameterExit(str(e)) from None
    for task in tasks:
        try:
            task.check_parameters()
        except ValueError as e:
            message = f"{task.task_family}: {e}; fix the parameter and rerun"
            print(error_line(message), file=sys.stderr, flush=True)
            raise BadParameterExit(message) from None


def check_output_root(output_root: str) -> None:
    """Refuses an output root no stage can write to, printing the stages' one error line.

    Raises:
        storage.UnsupportedStorageError: naming the scheme and what is supported.
    """
    try:
        storage.check_supported(output_root)
        if storage.is_remote(output_root) and config.Executor().kind == "docker":
            raise storage.UnsupportedStorageError(
                f"output root {output_root} is remote and [Executor] kind = docker: containers "
                "see only mounted local folders and get no cloud credentials; use kind = local "
                "for a gs:// root, or a local output root with docker"
            )
    except storage.UnsupportedStorageError as e:
        print(error_line(str(e)), file=sys.stderr, flush=True)
        raise
