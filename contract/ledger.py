"""The run ledger: one JSON record per attempt of an entry point, kept under the output root.

A local root keeps every record as one line of `<output_root>/ledger.jsonl`, appended with one
`write` on an `O_APPEND` descriptor (under a `flock` of the file) and fsynced, so processes
appending at once never interleave lines and a record that was written survives a power loss.
An object store cannot append: on gs:// each record is its own object,
`<output_root>/ledger/<start>-<pid>-<hex>.json`. `read` merges both forms and orders the records
by start time.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import uuid
from collections.abc import Mapping
from typing import Any

from contract import atomic, gfile, layout, storage

SCHEMA_VERSION = 1
LEDGER_FILE = "ledger.jsonl"
LEDGER_DIR = "ledger"

# What became of an attempt. A whole night ends blessed or not-blessed; a stage run alone
# ends succeeded; skipped-complete found nothing to do.
BLESSED = "blessed"
NOT_BLESSED = "not-blessed"
FAILED = "failed"
REFUSED = "refused"
SKIPPED_COMPLETE = "skipped-complete"
SUCCEEDED = "succeeded"
OUTCOMES = (BLESSED, NOT_BLESSED, FAILED, REFUSED, SKIPPED_COMPLETE, SUCCEEDED)

logger = logging.getLogger(__name__)


def ledger_path(output_root: str) -> str:
    """The local ledger file, `<output_root>/ledger.jsonl`."""
    return layout.join(output_root, LEDGER_FILE)


def record_object_name(started_utc: str, pid: int) -> str:
    """Names one record's object on a store: `<start, compact UTC>-<pid>-<random hex>.json`."""
    start = datetime.datetime.fromisoformat(started_utc).astimezone(datetime.UTC)
    return f"{start:%Y%m%dT%H%M%S%fZ}-{pid}-{uuid.uuid4().hex[:12]}.json"


def append(output_root: str, record: Mapping[str, Any]) -> str:
    """Adds `record` (stamped with the schema version) to the ledger, durably.

    Args:
        output_root: the output root, a local folder or a gs:// URL.
        record: the attempt's fields; `started_utc` (ISO 8601) names a store's object.

    Returns:
        The file or object written.

    Raises:
        OSError, tf.errors.OpError: the record could not be written.
    """
    document = {"schema": SCHEMA_VERSION, **record}
    data = (json.dumps(document, sort_keys=True) + "\n").encode()
    if storage.is_remote(output_root):
        folder = layout.join(output_root, LEDGER_DIR)
        name = record_object_name(str(record["started_utc"]), int(record.get("pid") or 0))
        path = layout.join(folder, name)
        gfile.makedirs(folder)
        with gfile.GFile(path, "wb") as f:  # an object appears whole once its upload ends
            f.write(data)
        return path
    path = ledger_path(output_root)
    created = not os.path.exists(path)
    os.makedirs(output_root or ".", exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        # O_APPEND alone keeps whole writes apart; the lock also keeps another appender's
        # write from landing between reading the last byte and writing after it.
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data  # a line cut short by a crash stays a line of its own
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(f"wrote {written} of {len(data)} bytes of a ledger record to {path}")
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        atomic.sync_folder(output_root or ".")
    return path


def read(output_root: str) -> list[dict[str, Any]]:
    """Every record of the ledger, both forms merged, in order of start time.

    A line or object that is not a JSON record (a write cut short by a crash) is skipped with a
    warning.
    """
    texts: list[tuple[str, str]] = []
    path = ledger_path(output_root)
    if gfile.exists(path):
        with gfile.GFile(path, "rb") as f:
            texts += [(path, line) for line in f.read().decode(errors="replace").splitlines()]
    folder = layout.join(output_root, LEDGER_DIR)
    if gfile.isdir(folder):
        for name in sorted(gfile.listdir(folder)):
            if name.endswith(".json"):
                with gfile.GFile(layout.join(folder, name), "rb") as f:
                    texts.append((name, f.read().decode(errors="replace")))
    records = []
    for source, text in texts:
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except ValueError:
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("started_utc"), str):
            logger.warning("skipped an unreadable ledger record in %s: %.80s", source, text)
            continue
        records.append(record)
    return sorted(records, key=lambda record: record["started_utc"])


def has_ledger(output_root: str) -> bool:
    """Whether the output root holds a ledger in either form."""
    return gfile.exists(ledger_path(output_root)) or gfile.isdir(
        layout.join(output_root, LEDGER_DIR)
    )


def folder_bytes(path: str) -> int:
    """The total size of the files under `path` (0 when it does not exist)."""
    if not gfile.isdir(path):
        return 0
    total = 0
    for folder, _, files in gfile.walk(path):
        for name in files:
            try:
                total += gfile.stat(layout.join(folder, name)).length
            except gfile.file_errors():  # removed while walking
                continue
    return total
