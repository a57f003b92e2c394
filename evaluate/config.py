"""The evaluate stage's typed configuration and the folders it derives from it."""

from __future__ import annotations

import dataclasses
import re

from contract import dates, layout, storage
from contract.run import DEFAULT_DATASET
from contract.settings import SettingsError
from evaluate.blessing import Thresholds
from evaluate.paired import check_confidence

SERVING_DIR = "serving"
# The export formats evaluate.serving.FORMATS registers (a test checks they agree); the config
# stays free of TensorFlow, which the Luigi process never loads.
EXPORT_FORMATS = ("saved_model",)
DEFAULT_MODEL_NAME = "nightly"
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclasses.dataclass(frozen=True)
class EvaluateConfig:
    """Everything one evaluation needs; folders follow contract.layout.

    A field's metadata (help) makes its `python -m evaluate` flag and its Luigi Evaluate
    parameter (contract.settings): a new setting is declared here and nowhere else.
    """

    output_root: str = dataclasses.field(
        metadata={"help": "Folder holding one subfolder per run date (and the latest pointer)."}
    )
    date: str = dataclasses.field(metadata={"help": "The run's date, YYYY-MM-DD."})
    dataset: str = dataclasses.field(
        default=DEFAULT_DATASET,
        metadata={"help": "The dataset the manifest must name (a guard against mixing runs)."},
    )
    batch_size: int = dataclasses.field(
        default=1000,
        metadata={
            "help": "Examples per inference batch; changes speed and memory, never the metrics."
        },
    )
    min_accuracy: float | None = dataclasses.field(
        default=None,
        metadata={
            "help": "Accuracy (0-1) a model needs to be blessed; empty for no absolute threshold."
        },
    )
    max_regression: float | None = dataclasses.field(
        default=None,
        metadata={
            "help": "Largest accuracy drop (0-1; 0.01 = one point) allowed against the last "
            "blessed model (<output_root>/latest.json) scored on this run's eval set; empty "
            "for no absolute change threshold."
        },
    )
    max_relative_regression: float | None = dataclasses.field(
        default=None,
        metadata={
            "help": "Largest accuracy drop against that baseline as a fraction of its accuracy "
            "(0-1; 0.01 = 1% of it); empty for no relative change threshold."
        },
    )
    confidence: float = dataclasses.field(
        default=0.95,
        metadata={
            "help": "Confidence level (0.5-1) of the paired interval of the accuracy change "
            "against the last blessed model; the change thresholds must hold at its lower end."
        },
    )
    bless_without_thresholds: bool = dataclasses.field(
        default=False,
        metadata={
            "help": "Bless every model when no threshold is set (a rubber stamp, recorded in "
            "blessing.json); without it an empty rule set is refused."
        },
    )
    export_base: str | None = dataclasses.field(
        default=None,
        metadata={
            "help": "Where blessed models are pushed as TF Serving SavedModels, "
            "<export_base>/<model_name>/<YYYYMMDDNN>/ (local path or gs:// URL); empty for "
            "<output_root>/serving."
        },
    )
    export_format: str = dataclasses.field(
        default="saved_model",
        metadata={
            "help": "How a blessed model is written for serving: saved_model, a SavedModel "
            "with both serving signatures for TF Serving.",
            "choices": EXPORT_FORMATS,
        },
    )
    model_name: str = dataclasses.field(
        default=DEFAULT_MODEL_NAME,
        metadata={
            "help": "The served model's name: the folder under export_base that TF Serving's "
            "--model_base_path names."
        },
    )

    def __post_init__(self) -> None:
        storage.check_supported(self.output_root)  # a ValueError naming the scheme
        dates.check(self.date)  # a ValueError naming the form a date takes
        if self.batch_size < 1:
            raise SettingsError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.min_accuracy is not None and not 0.0 <= self.min_accuracy <= 1.0:
            raise SettingsError(f"min_accuracy is a fraction in [0, 1], got {self.min_accuracy}")
        if self.max_regression is not None and not 0.0 <= self.max_regression <= 1.0:
            raise SettingsError(
                f"max_regression is a fraction in [0, 1], got {self.max_regression}"
            )
        relative = self.max_relative_regression
        if relative is not None and not 0.0 <= relative <= 1.0:
            raise SettingsError(f"max_relative_regression is a fraction in [0, 1], got {relative}")
        check_confidence(self.confidence)
        if self.thresholds.empty and not self.bless_without_thresholds:
            raise SettingsError(
                "no blessing threshold is set (min_accuracy, max_regression, "
                "max_relative_regression): an empty rule set would bless any model; set one, "
                "or set bless_without_thresholds to bless without them"
            )
        if self.export_base is not None:
            storage.check_supported(self.export_base, "export base")
        check_model_name(self.model_name)
        if self.export_format not in EXPORT_FORMATS:
            raise SettingsError(
                f"export_format must be one of {', '.join(EXPORT_FORMATS)}, got "
                f"{self.export_format!r}"
            )

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
            confidence=self.confidence,
            bless_without_thresholds=self.bless_without_thresholds,
        )

    @property
    def serving_base(self) -> str:
        """The export base: the given one, or `<output_root>/serving`."""
        return self.export_base or layout.join(self.output_root, SERVING_DIR)

    @property
    def latest_pointer_path(self) -> str:
        return layout.join(self.output_root, layout.LATEST_POINTER_FILE)


def check_model_name(name: str) -> None:
    """Refuses a model name that is not one plain folder name.

    Raises:
        SettingsError: naming the model name and what is allowed.
    """
    if not _MODEL_NAME.fullmatch(name):
        raise SettingsError(
            f"model_name {name!r} must be one folder name of letters, digits, '.', '_' or '-' "
            "(not starting with '.' or '-')"
        )
