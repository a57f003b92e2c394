"""The lines a stage prints for whoever runs it: its one-line error, progress and notices.

A stage that fails prints exactly one line `error: <what is wrong and what to do>` on stderr
and exits non-zero; the pipeline quotes the last such line in its own failure. Training prints
one `PROGRESS {json}` line per epoch (chief only), which the pipeline turns into Luigi's
progress percentage and status message. A `NOTICE <text>` line is an event the user should see
while the stage goes on (a restarted cluster); the pipeline shows it in the terminal. Nothing
else in a stage's output is parsed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

ERROR_PREFIX = "error: "
PROGRESS_PREFIX = "PROGRESS "
NOTICE_PREFIX = "NOTICE "

# Exit codes every stage uses: bad input cannot be fixed by retrying, other failures might be.
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def error_line(message: str) -> str:
    """The one line a failing stage prints: `error: <message>` with any newlines folded."""
    return ERROR_PREFIX + " ".join(str(message).split())


def progress_line(values: dict[str, Any]) -> str:
    """One progress line: `PROGRESS {"epoch": 3, "epochs": 25, "loss": ...}`."""
    return PROGRESS_PREFIX + json.dumps(values, sort_keys=True)


def parse_progress(line: str) -> dict[str, Any] | None:
    """The values of a progress line, or None when `line` is not one (or is malformed)."""
    if not line.startswith(PROGRESS_PREFIX):
        return None
    try:
        values = json.loads(line[len(PROGRESS_PREFIX) :])
    except ValueError:
        return None
    return values if isinstance(values, dict) else None


def notice_line(message: str) -> str:
    """One notice line: `NOTICE <message>` with any newlines folded."""
    return NOTICE_PREFIX + " ".join(str(message).split())


def parse_notice(line: str) -> str | None:
    """The text of a notice line, or None when `line` is not one."""
    if not line.startswith(NOTICE_PREFIX):
        return None
    return line[len(NOTICE_PREFIX) :].strip() or None


def last_error(lines: Iterable[str]) -> str | None:
    """The message of the last `error: ...` line among `lines`, or None when there is none."""
    found = None
    for line in lines:
        stripped = line.strip()
        if stripped.startswith(ERROR_PREFIX):
            found = stripped[len(ERROR_PREFIX) :]
    return found
