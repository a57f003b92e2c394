"""One benchmark's outcome: a candidate and a baseline measured in the same run, and their ratio."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Result:
    """A candidate/baseline pair; `higher_is_better` says which way the ratio reads.

    ratio = candidate / baseline when higher is better (throughput), baseline / candidate when
    lower is better (seconds), so a ratio above 1.0 always means the candidate is ahead.
    """

    benchmark: str
    candidate: str
    baseline: str
    candidate_value: float
    baseline_value: float
    unit: str
    target_ratio: float
    higher_is_better: bool = True
    notes: str = ""

    @property
    def ratio(self) -> float:
        if self.higher_is_better:
            return self.candidate_value / self.baseline_value
        return self.baseline_value / self.candidate_value

    def markdown_row(self) -> str:
        met = "yes" if self.ratio >= self.target_ratio else "no"
        return (
            f"| {self.benchmark} | {self.candidate} | {self.baseline} "
            f"| {self.candidate_value:,.1f} {self.unit} | {self.baseline_value:,.1f} {self.unit} "
            f"| {self.ratio:.2f}x | >= {self.target_ratio:.2f}x | {met} |"
        )
