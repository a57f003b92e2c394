"""The workers' logs: where they go, the chief's copied to the console, a dead worker's reason.

Each worker logs to `<folder>/worker-<index>.log`: a local train dir's `logs/`, or for a gs://
train dir a local folder whose files are copied to `<train dir>/logs` when the launch ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from typing import IO

from contract import gfile, layout, storage
from contract.messages import ERROR_PREFIX
from train.config import TrainConfig

logger = logging.getLogger("train.launcher")


def log_dir_for(config: TrainConfig, log_dir: str | None = None) -> str:
    """Where the workers' logs go: `log_dir`, or `<train dir>/logs`.

    Logs are appended to while the workers run, which an object store cannot do: for a gs://
    train dir they go to its local state folder (`contract.storage.local_state_dir`) and are
    copied to `<train dir>/logs` when the launch ends.
    """
    return log_dir or storage.local_state_dir(layout.join(config.train_dir, "logs"))


def last_error_line(path: str) -> str:
    """The worker's own one-line complaint ("error: ..."), else its last exception line."""
    with contextlib.suppress(OSError), open(path, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
        for line in reversed(lines):
            if line.startswith(ERROR_PREFIX):
                return line[len(ERROR_PREFIX) :]
        for line in reversed(lines):
            if re.match(r"^[\w.]+(Error|Exception)\b", line):
                return line
        return lines[-1] if lines else ""
    return ""


class ChiefTail:
    """Copies what the chief appends to its log onto the console."""

    def __init__(self, path: str, out: IO[str]) -> None:
        self.path = path
        self.out = out
        self.offset = os.path.getsize(path) if os.path.exists(path) else 0

    def pump(self) -> None:
        if not os.path.exists(self.path):
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        self.offset += len(chunk)
        if chunk:
            self.out.write(chunk.decode(errors="replace"))
            self.out.flush()


def copy_logs_to_store(config: TrainConfig, log_dir: str | None) -> None:
    """Copies the workers' local logs of a gs:// train dir to `<train dir>/logs`."""
    remote = layout.join(config.train_dir, "logs")
    if log_dir is not None or not storage.is_remote(remote):
        return
    try:
        gfile.upload_folder(log_dir_for(config), remote)
    except Exception as e:  # noqa: BLE001 - a lost log copy must not change training's result
        logger.warning("could not copy the workers' logs to %s: %s", remote, e)
