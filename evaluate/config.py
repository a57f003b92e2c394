"""The evaluate stage's typed configuration and the folders it derives from it."""

from __future__ import annotations

import dataclasses

from contract import dates, layout, storage
from evaluate import serving
from evaluate.blessing import Thresholds

SERVING_DIR = "serving"
DEFAULT_MODEL_NAME = "nightly"


@dataclasses.dataclass(frozen=True)
class EvaluateConfig:
    """Everything one evaluation needs; folders follow contract.layout.

    Attributes:
        output_root: folder holding one subfolder per run date (and the `latest` pointer).
        date: the run's date, `YYYY-MM-DD`.
        dataset: the dataset the manifest must name (a guard against mixing runs).
        batch_size: examples per inference batch; it changes speed, never the numbers.
        min_accuracy: absolute accuracy a model needs to be blessed; None skips the check.
        max_regression: largest accuracy drop allowed against the last blessed model scored
            on this run's eval set, in accuracy (0.01 is one percentage point); None skips it.
        max_relative_regression: the same as a fraction of that baseline accuracy (0.01 is
            1 % of it); None skips it.
        export_base: where blessed models are pushed for TF Serving, as
            `<export_base>/<model_name>/<version>/`; None for `<output_root>/serving`.
        model_name: the served model's name, one folder name.
    """

    output_root: str
    date: str
    dataset: str = "fashion_mnist"
    batch_size: int = 1000
    min_accuracy: float | None = None
    max_regression: float | None = None
    max_relative_regression: float | None = None
    export_base: str | None = None
    model_name: str = DEFAULT_MODEL_NAME

    def __post_init__(self) -> None:
        storage.check_supported(self.output_root)  # a ValueError naming the scheme
        dates.check(self.date)  # a ValueError naming the form a date takes
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.min_accuracy is not None and not 0.0 <= self.min_accuracy <= 1.0:
            raise ValueError(f"min_accuracy is a fraction in [0, 1], got {self.min_accuracy}")
        if self.max_regression is not None and not 0.0 <= self.max_regression <= 1.0:
            raise ValueError(f"max_regression is a fraction in [0, 1], got {self.max_regression}")
        relative = self.max_relative_regression
        if relative is not None and not 0.0 <= relative <= 1.0:
            raise ValueError(f"max_relative_regression is a fraction in [0, 1], got {relative}")
        if self.export_base is not None:
            storage.check_supported(self.export_base, "export base")
        serving.check_model_name(self.model_name)

    @property
    def data_dir(self) -> str:
        return layout.data_dir(self.output_root, self.date)

    @property
    def train_dir(self) -> str:
        return layout.train_dir(self.output_root, self.date)

    @property
    def evaluate_dir(self) -> str:
        return layout.evaluate_dir(self.output_root, self.date)

    @property
    def model_path(self) -> str:
        return layout.join(self.train_dir, layout.MODEL_FILE)

    @property
    def history_path(self) -> str:
        return layout.join(self.train_dir, layout.HISTORY_FILE)

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds(
            min_accuracy=self.min_accuracy,
            max_regression=self.max_regression,
            max_relative_regression=self.max_relative_regression,
        )

    @property
    def serving_base(self) -> str:
        """The export base: the given one, or `<output_root>/serving`."""
        return self.export_base or layout.join(self.output_root, SERVING_DIR)

    @property
    def latest_pointer_path(self) -> str:
        return layout.join(self.output_root, layout.LATEST_POINTER_FILE)
