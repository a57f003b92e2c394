"""Parameters every stage's task shares; their values come from luigi.cfg's [Preprocess] section.

Train and Evaluate must agree with the shard set they read, so their shared parameters fall
back to [Preprocess] (luigi's `config_path`) instead of repeating the values per section.
"""

from __future__ import annotations

import datetime
import sys

import luigi
from luigi.parameter import ConfigPath

from contract import layout, run_lock, settings, storage
from contract.messages import error_line
from pipeline import config
from pipeline.stage_params import parameter_for
from preprocess.config import PreprocessConfig


def _from_preprocess(name: str) -> ConfigPath:
    return {"section": "Preprocess", "name": name}


_PREPROCESS = {s.name: s for s in settings.settings_of(PreprocessConfig)}


class RunTask(luigi.Task):
    """Base of the stage tasks: the run's date, where it writes, the dataset and worker count."""

    date = luigi.DateParameter(
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
        # luigi asks the task it was started with for complete() before anything else runs:
        # an unsupported output root stops the run here, with the stages' own error line.
        check_output_root(self.output_root)
        return bool(super().complete())

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
