"""The evaluate stage's typed configuration and the folders it derives from it."""

from __future__ import annotations

import dataclasses

from contract import layout, storage


@dataclasses.dataclass(frozen=True)
class EvaluateConfig:
    """Everything one evaluation needs; folders follow contract.layout.

    Attributes:
        output_root: folder holding one subfolder per run date (and the `latest` pointer).
        date: the run's date, `YYYY-MM-DD`.
        dataset: the dataset the manifest must name (a guard against mixing runs).
        batch_size: examples per inference batch; it changes speed, never the numbers.
        min_accuracy: absolute accuracy a model needs to be blessed; None skips the check.
        max_regression: largest accuracy drop allowed against the last blessed model, as a
            fraction (0.01 is one percentage point); None skips the comparison.
    """

    output_root: str
    date: str
    dataset: str = "fashion_mnist"
    batch_size: int = 1000
    min_accuracy: float | None = None
    max_regression: float | None = None

    def __post_init__(self) -> None:
        storage.check_supported(self.output_root)  # a ValueError naming the scheme
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.min_accuracy is not None and not 0.0 <= self.min_accuracy <= 1.0:
            raise ValueError(f"min_accuracy is a fraction in [0, 1], got {self.min_accuracy}")
        if self.max_regression is not None and not 0.0 <= self.max_regression <= 1.0:
            raise ValueError(f"max_regression is a fraction in [0, 1], got {self.max_regression}")

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
    def latest_pointer_path(self) -> str:
        return layout.join(self.output_root, layout.LATEST_POINTER_FILE)
