"""The evaluate stage: score the chief's final model on the whole eval split, report, bless.

`evaluate.run(EvaluateConfig(...))` from Python, `python -m evaluate --help` from a shell.
"""

from typing import Any

from evaluate.config import EvaluateConfig

__all__ = ["EvaluateConfig", "run"]


def __getattr__(name: str) -> Any:
    # `evaluate.run` imports TensorFlow on first use: Luigi's process reads EvaluateConfig only.
    if name == "run":
        from evaluate.stage import run

        return run
    raise AttributeError(f"module 'evaluate' has no attribute {name!r}")
