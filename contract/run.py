"""One night's run: what every stage shares, checked once where it is made, and its paths.

A `Run` is the output root, the date (a `datetime.date`), the dataset and the number of
workers. It is made once (by the Luigi task, from its parameters) and checked there; each
stage's config takes the fields of it that its stage names (`settings_for`), and every folder and
file of the run derives from it, never parsed back out of a path.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from contract import dates, layout, manifest, storage
from contract.settings import SettingsError

# The dataset a run reads when none is named: Fashion-MNIST, built offline from its files.
DEFAULT_DATASET = "fashion_mnist"
# The run's fields and folders a stage config may take from it (`Run.settings_for`).
RUN_SETTINGS = ("output_root", "date", "dataset", "num_workers", "data_dir", "train_dir")


@dataclasses.dataclass(frozen=True)
class Run:
    """What every stage of one night shares.

    Attributes:
        output_root: the folder (local path or gs:// URL) holding one folder per night.
        date: the night.
        dataset: the dataset every stage reads or checks against.
        num_workers: the training workers (and the shard set's parts).

    Raises:
        SettingsError: (on construction) an unsupported storage scheme, a worker count below
            1 or an empty dataset, in one line.
    """

    output_root: str
    date: datetime.date
    dataset: str
    num_workers: int

    def __post_init__(self) -> None:
        try:
            storage.check_supported(self.output_root)
        except storage.UnsupportedStorageError as e:
            raise SettingsError(str(e)) from None
        if not isinstance(self.date, datetime.date):
            raise SettingsError(f"a run's date is a date, got {self.date!r}")
        if self.num_workers < 1:
            raise SettingsError(f"num_workers must be at least 1, got {self.num_workers}")
        if not self.dataset.strip():
            raise SettingsError("dataset is empty: name a TFDS dataset or an adapter's source")

    @classmethod
    def of(cls, output_root: str, date: str, dataset: str, num_workers: int) -> Run:
        """A run from text, as a command line gives it; the date checked by contract.dates."""
        try:
            day = dates.parse(date)
        except dates.DateError as e:
            raise SettingsError(str(e)) from None
        return cls(output_root, day, dataset, num_workers)

    @property
    def date_str(self) -> str:
        return self.date.isoformat()

    @property
    def run_dir(self) -> str:
        return layout.run_dir(self.output_root, self.date_str)

    @property
    def data_dir(self) -> str:
        return layout.data_dir(self.output_root, self.date_str)

    @property
    def train_dir(self) -> str:
        return layout.train_dir(self.output_root, self.date_str)

    @property
    def evaluate_dir(self) -> str:
        return layout.evaluate_dir(self.output_root, self.date_str)

    @property
    def logs_dir(self) -> str:
        return layout.logs_dir(self.output_root, self.date_str)

    @property
    def manifest_path(self) -> str:
        return layout.join(self.data_dir, layout.MANIFEST_FILE)

    @property
    def data_gate_path(self) -> str:
        return layout.join(self.data_dir, manifest.DATA_GATE_FILE)

    @property
    def history_path(self) -> str:
        return layout.join(self.train_dir, layout.HISTORY_FILE)

    @property
    def metrics_path(self) -> str:
        return layout.join(self.evaluate_dir, layout.METRICS_FILE)

    def settings_for(self, names: tuple[str, ...]) -> dict[str, Any]:
        """The values of the run's fields and folders `names` (a stage config's fields that
        the run gives), as a command line carries them (the date as `YYYY-MM-DD`).

        Raises:
            KeyError: a name that is none of RUN_SETTINGS.
        """
        values = {
            "output_root": self.output_root,
            "date": self.date_str,
            "dataset": self.dataset,
            "num_workers": self.num_workers,
            "data_dir": self.data_dir,
            "train_dir": self.train_dir,
        }
        return {name: values[name] for name in names}
