"""The one error type of the preprocess stage: a problem the user can fix, told in one line."""

from __future__ import annotations


class PreprocessError(Exception):
    """Bad input or an unusable environment; the message names the thing and what to do."""
