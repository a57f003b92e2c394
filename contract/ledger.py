"""The run ledger: one JSON record per attempt of an entry point, kept under the output root.

A local root keeps every record as one line of `<output_root>/ledger.jsonl`, appended with one
`write` on an `O_APPEND` descriptor (under a `flock` of the file) and fsynced, so processes
appending at once never interleave lines and a record that was written survives a power loss.
An object store cannot append: on gs:// each record is its own object,
`<output_root>/ledger/<start>-<pid>-<hex>.json`. `read` merges both forms and orders the records
by start time.

An attempt is filed twice: a short start record (`"phase": "started"`) as it begins, and its
record as it ends, both carrying its `attempt_id`. `read` gives one record per attempt: the end
record when there is one; else, for an attempt that is no longer running (killed, crashed, its
machine gone), its start record as a `failed` record that says it ended without one. On a store
the start object is removed once the end record is written.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import socket
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
# An attempt that has begun and is still running: only `read(..., running=True)` gives it.
RUNNING = "running"

# A start record's `phase`; an end record has none.
STARTED = "started"
# The reason of an attempt that began and is gone without its end record.
ENDED_WITHOUT_RECORD = "the attempt ended without a record (killed or crashed)"
# An attempt begun on another machine cannot be looked up: it counts as running this long.
OTHER_HOST_RUNNING_HOURS = 24
# A process started this long after an attempt's start record is another, under a reused pid.
PID_REUSE_SLACK_SECONDS = 2.0

logger = logging.getLogger(__name__)


def ledger_path(output_root: str) -> str:
    """The local ledger file, `<output_root>/ledger.jsonl`."""
    return layout.join(output_root, LEDGER_FILE)


def record_object_name(started_utc: str, pid: int) -> str:
    """Names one record's object on a store: `<start, compact UTC>-<pid>-<random hex>.json`."""
    start = datetime.datetime.fromisoformat(started_utc).astimezone(datetime.UTC)
    return f"{start:%Y%m%dT%H%M%S%fZ}-{pid}-{uuid.uuid4().hex[:12]}.json"


def begin(output_root: str, record: Mapping[str, Any]) -> str:
    """Files an attempt's start record: `record` (its `attempt_id`, `date`, `entry_point`,
    `started_utc`, `host`, `pid`, `command`) marked `"phase": "started"`.

    Returns:
        The file or object written; pass it to `append` as `replaces` with the end record.

    Raises:
        OSError, tf.errors.OpError: the record could not be written.
    """
    return append(output_root, {**record, "phase": STARTED})


def append(output_root: str, record: Mapping[str, Any], replaces: str | None = None) -> str:
    """Adds `record` (stamped with the schema version) to the ledger, durably.

    Args:
        output_root: the output root, a local folder or a gs:// URL.
        record: the attempt's fields; `started_utc` (ISO 8601) names a store's object.
        replaces: the attempt's start object on a store (what `begin` returned), removed once
            `record` is written; a line of the local file stays, and `read` merges it.

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
        if replaces is not None and replaces != path:
            try:
                gfile.remove(replaces)
            except gfile.file_errors() as e:  # `read` merges the two anyway
                logger.warning("could not remove the start record %s: %s", replaces, e)
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


def read(output_root: str, running: bool = False) -> list[dict[str, Any]]:
    """One record per attempt, both forms merged (`merged`), in order of start time.

    Args:
        output_root: the output root, a local folder or a gs:// URL.
        running: also give the attempts still running, as records whose outcome is RUNNING
            (by default an attempt counts once it has ended).

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
    return sorted(merged(records, running), key=lambda record: record["started_utc"])


def merged(records: list[dict[str, Any]], running: bool = False) -> list[dict[str, Any]]:
    """One record per attempt: end records as they are, and each start record without an end
    record as the attempt stands (`ended_without_record`; `running` ones only when asked)."""
    ended = {r["attempt_id"] for r in records if r.get("phase") != STARTED and "attempt_id" in r}
    found = []
    for record in records:
        if record.get("phase") != STARTED:
            found.append(record)
        elif record.get("attempt_id") not in ended:
            if not still_running(record):
                found.append(ended_without_record(record))
            elif running:
                found.append(_unended(record, RUNNING, None))
    return found


def ended_without_record(start: Mapping[str, Any]) -> dict[str, Any]:
    """The record of an attempt that began (`start`, its start record) and is gone without
    writing its end: failed, in its entry point, with ENDED_WITHOUT_RECORD as the reason."""
    return _unended(start, FAILED, ENDED_WITHOUT_RECORD) | {"ended_without_record": True}


def _unended(start: Mapping[str, Any], outcome: str, reason: str | None) -> dict[str, Any]:
    record = {key: value for key, value in start.items() if key != "phase"}
    return record | {
        "ended_utc": None,
        "wall_seconds": None,
        "outcome": outcome,
        "stage": start.get("entry_point") if reason else None,
        "reason": reason,
        "stages": [],
    }


def still_running(start: Mapping[str, Any], now: datetime.datetime | None = None) -> bool:
    """Whether the attempt of a start record may still be running.

    On this machine: its pid is a live process (not a zombie) that started no later than the
    record (a later one reuses the pid). From another machine nothing can be looked up: it
    counts as running for OTHER_HOST_RUNNING_HOURS after it began.
    """
    try:
        started = datetime.datetime.fromisoformat(str(start["started_utc"]))
        pid = int(start["pid"])
    except (KeyError, TypeError, ValueError):
        return False
    if start.get("host") != socket.gethostname():
        now = now or datetime.datetime.now(datetime.UTC)
        return now - started < datetime.timedelta(hours=OTHER_HOST_RUNNING_HOURS)
    began = process_start(pid)
    if began is None:
        return False
    return began <= started.timestamp() + PID_REUSE_SLACK_SECONDS


def process_start(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch), or None when it is gone or a
    zombie. Without /proc, a live process counts as started at the epoch."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
        with open("/proc/stat", encoding="ascii", errors="replace") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith("btime "))
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None  # /proc is there: the process is gone
        return _alive_without_proc(pid)
    except (OSError, StopIteration, ValueError):
        return _alive_without_proc(pid)
    # Fields after the command's closing parenthesis: state is the 3rd, start time the 22nd.
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _alive_without_proc(pid: int) -> float | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return 0.0  # alive, another user's
    return 0.0


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
