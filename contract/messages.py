"""The lines a stage prints for whoever runs it: its one-line error, progress and notices.

A stage that fails prints exactly one line `error: <what is wrong and what to do>` on stderr
and exits non-zero; the pipeline quotes the last such line in its own failure. Training prints
one `PROGRESS {json}` line per epoch (chief only), which the pipeline turns into Luigi's
progress percentage and status message. A `NOTICE <text>` line is an event the user should see
while the stage goes on (a restarted cluster); the pipeline shows it in the terminal. Nothing
else in a stage's output is parsed.
"""

from __future__ import annotations

import argparse
import errno
import json
import re
import sys
from collections.abc import Iterable
from typing import Any, NoReturn

ERROR_PREFIX = "error: "
PROGRESS_PREFIX = "PROGRESS "
NOTICE_PREFIX = "NOTICE "
# TensorFlow's op errors quote the Python stack that defined the failing op between the node's
# name and the cause; the worker's log keeps the whole message, the error line only the rest.
_OP_DEFINITION_STACK = re.compile(
    r"\s+defined at \(most recent call last\):(?:\s*File \"[^\"\n]*\", line \d+, in [^\n]*)*"
)

# Exit codes every stage uses. 1-127: a restart cannot fix it (bad input, bad settings, a
# corrupt shard, a full disk); 128-255: it might (a vanished peer, a pre-emption). The split is
# Kubeflow's TFJob `restartPolicy: ExitCode`; 138 is the code it keeps for "retry me".
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_DISK_FULL = 3
EXIT_RETRYABLE = 138
# A training worker's exit once the pre-emption backup is written (or could not be), as a
# SIGTERMed process's: 128 + SIGTERM.
EXIT_PREEMPTED = 143


def restart_may_help(exit_code: int) -> bool:
    """Whether a process that exited with `exit_code` may succeed when started again.

    A negative code (killed by a signal, as `subprocess` reports it) or 128-255 (a signal as a
    shell or container runtime reports it, or EXIT_RETRYABLE) may; 1-127 is permanent.
    """
    return exit_code < 0 or exit_code >= 128


def error_line(message: str) -> str:
    """The one line a failing stage prints: `error: <message>` with any newlines folded and
    the stack TensorFlow quotes in an op's error left out."""
    return ERROR_PREFIX + " ".join(_OP_DEFINITION_STACK.sub(":", str(message)).split())


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


class StageArgumentParser(argparse.ArgumentParser):
    """An argument parser whose errors are the stages' one line, `error: ...`, and exit 2
    (argparse's own print its whole usage block first)."""

    def error(self, message: str) -> NoReturn:
        print(error_line(f"{self.prog}: {message} (see --help)"), file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_INPUT)


def no_space_left(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from, says the filesystem is full (ENOSPC,
    or a runner's wrapped "No space left on device"): no retry helps with that."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno == errno.ENOSPC:
            return True
        if "No space left" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False
