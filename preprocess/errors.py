"""The error types of the preprocess stage: a problem the user can fix, told in one line."""

from __future__ import annotations

import re

from contract.settings import SettingsError

# How a Beam runner reports an exception raised in a step: in-process runners re-raise it with
# the step's name appended; others (another process, a cloud worker) hand back its traceback.
_STEP_SUFFIX = re.compile(r"\s*\[while running '[^']*'\]\s*$")
_IN_TRACEBACK = re.compile(r"preprocess\.errors\.(BadInputError|PreprocessError): (.+)")


class PreprocessError(Exception):
    """Bad input or an unusable environment; the message names the thing and what to do."""


class BadInputError(PreprocessError, SettingsError):
    """The dataset or a parameter is wrong: running again unchanged cannot help (exit 2)."""


def from_runner_failure(error: BaseException) -> PreprocessError | None:
    """The stage's own error inside a failure a Beam runner raised, or None if there is none.

    A step that finds bad input (an image of another size, a record without its label) raises
    one of this module's errors on a worker; the runner wraps it, and this unwraps it so the
    command line can print its one line.
    """
    if isinstance(error, PreprocessError):
        return type(error)(_STEP_SUFFIX.sub("", str(error)))
    found = _IN_TRACEBACK.findall(str(error))
    if not found:
        return None
    kind, message = found[-1]
    cls = BadInputError if kind == "BadInputError" else PreprocessError
    return cls(_STEP_SUFFIX.sub("", message.strip()))
