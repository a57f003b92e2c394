"""The evaluate stage: score the chief's final model on the whole eval split, report, bless.

`evaluate.run(EvaluateConfig(...))` from Python, `python -m evaluate --help` from a shell.
"""

from evaluate.config import EvaluateConfig
from evaluate.stage import run

__all__ = ["EvaluateConfig", "run"]
