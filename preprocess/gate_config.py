"""The data gate's settings, apart from the gate so that Luigi's process reads them without
importing what the gate runs on (TensorFlow)."""

from __future__ import annotations

import dataclasses
import math

from contract import dates
from preprocess.errors import BadInputError

# The thresholds' names in anomalies.json and data_gate.json: the config's without `_threshold`.
THRESHOLD_NAMES = ("label_drift", "pixel_mean_shift", "pixel_stddev_shift")


@dataclasses.dataclass(frozen=True)
class DataGateConfig:
    """Everything one run of the gate needs.

    A field's metadata (help) makes its `python -m preprocess.data_gate` flag and its Luigi
    DataGate parameter (contract.settings): a new setting is declared here and nowhere else.
    """

    output_root: str = dataclasses.field(
        metadata={
            "help": "Folder holding one subfolder per run date, and the kept schema "
            "(<output_root>/data_gate/schema.pbtxt)."
        }
    )
    date: str = dataclasses.field(metadata={"help": "The run's date, YYYY-MM-DD."})
    label_drift_threshold: float = dataclasses.field(
        default=0.1,
        metadata={
            "help": "Largest L-infinity distance between the label distribution of the night's "
            "training data and the previous passed night's (0.1: no class's share moves by "
            "more than 10 points)."
        },
    )
    pixel_mean_shift_threshold: float = dataclasses.field(
        default=0.1,
        metadata={
            "help": "Largest change of the mean pixel value from the previous passed night, in "
            "units of that night's pixel standard deviation."
        },
    )
    pixel_stddev_shift_threshold: float = dataclasses.field(
        default=0.1,
        metadata={
            "help": "Largest change of the pixel standard deviation from the previous passed "
            "night, relative to it."
        },
    )
    min_window_days: int | None = dataclasses.field(
        default=None,
        metadata={
            "help": "drops: datasets: fewest days of the night's window that must have files; "
            "a window with fewer fails the gate (--DataGate-accept-anomalies lets it through). "
            "Empty: every day of the window."
        },
    )
    accept_anomalies: bool = dataclasses.field(
        default=False,
        metadata={
            "help": "Let the night's data through whatever the gate finds (the anomalies are "
            "still written and the verdict says 'accepted'). Per run only "
            "(--DataGate-accept-anomalies); never set it in luigi.cfg."
        },
    )
    reset_schema: bool = dataclasses.field(
        default=False,
        metadata={
            "help": "Infer the schema again from the night's training data, after a deliberate "
            "change of the data, and keep it once the night passes (or its anomalies are "
            "accepted); recorded in the night's data_gate.json. Per run only "
            "(--DataGate-reset-schema); never set it in luigi.cfg."
        },
    )

    def check(self) -> None:
        """Rejects settings the gate cannot honour.

        Raises:
            BadInputError: naming the setting and what it must be.
        """
        try:
            dates.check(self.date)
        except dates.DateError as e:
            raise BadInputError(str(e)) from None
        if self.min_window_days is not None and self.min_window_days < 1:
            raise BadInputError(
                f"min_window_days must be at least 1 (a number of days), got {self.min_window_days}"
            )
        for name in THRESHOLD_NAMES:
            value = getattr(self, f"{name}_threshold")
            if not (math.isfinite(value) and value >= 0):
                raise BadInputError(
                    f"{name}_threshold must be a finite number of at least 0, got {value}"
                )

    @property
    def thresholds(self) -> dict[str, float]:
        """The thresholds as anomalies.json and data_gate.json record them."""
        return {name: getattr(self, f"{name}_threshold") for name in THRESHOLD_NAMES}
