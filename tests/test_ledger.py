"""The run ledger's file: whole lines from concurrent appenders, one object a record on gs://,
and both forms read back merged in order of start time."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest

from contract import ledger, storage
from tests import gcs_emulator
from tests.factories import PROJECT_ROOT

RECORDS_PER_WRITER = 200
# Each writer waits for the go file, then appends its records as fast as it can.
APPEND_RECORDS = """
import os, sys, time
from contract import ledger
root, go, writer, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
while not os.path.exists(go):
    time.sleep(0.001)
for i in range(count):
    ledger.append(root, {"started_utc": f"2026-01-31T01:30:00.{i:06d}+00:00",
                         "writer": writer, "i": i, "padding": writer * 3000})
"""


def record(date: str, started: str, **fields) -> dict:
    return {"date": date, "started_utc": started, "outcome": ledger.BLESSED, **fields}


def test_two_processes_appending_at_once_leave_whole_lines(tmp_path):
    root, go = tmp_path / "runs", tmp_path / "go"
    writers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                APPEND_RECORDS,
                str(root),
                str(go),
                name,
                str(RECORDS_PER_WRITER),
            ],
            cwd=PROJECT_ROOT,
        )
        for name in ("a", "b")
    ]
    time.sleep(0.5)  # both are waiting for the go file
    go.touch()
    assert [writer.wait(timeout=120) for writer in writers] == [0, 0]

    lines = (root / ledger.LEDGER_FILE).read_text().splitlines()
    assert len(lines) == 2 * RECORDS_PER_WRITER
    records = [json.loads(line) for line in lines]  # every line is one whole record
    for name in ("a", "b"):
        mine = [r for r in records if r["writer"] == name]
        assert [r["i"] for r in mine] == list(range(RECORDS_PER_WRITER))
        assert all(
            r["padding"] == name * 3000 and r["schema"] == ledger.SCHEMA_VERSION for r in mine
        )


def test_a_line_cut_short_is_skipped_and_the_next_record_stays_whole(tmp_path, caplog):
    root = tmp_path / "runs"
    ledger.append(str(root), record("2026-01-31", "2026-01-31T01:30:00+00:00"))
    with open(root / ledger.LEDGER_FILE, "a") as f:
        f.write('{"date": "2026-02-01", "started_')  # a crash in the middle of a write
    ledger.append(str(root), record("2026-02-01", "2026-02-01T01:30:00+00:00"))

    assert [r["date"] for r in ledger.read(str(root))] == ["2026-01-31", "2026-02-01"]
    assert "skipped an unreadable ledger record" in caplog.text


def test_records_read_back_in_order_of_start_from_both_forms(tmp_path):
    root = tmp_path / "runs"
    ledger.append(str(root), record("2026-02-02", "2026-02-02T01:30:00+00:00"))
    ledger.append(str(root), record("2026-01-31", "2026-01-31T01:30:00+00:00"))
    (root / ledger.LEDGER_DIR).mkdir()  # a record as a store keeps it, copied down
    copied = record("2026-02-01", "2026-02-01T01:30:00+00:00")
    (root / ledger.LEDGER_DIR / "20260201T013000000000Z-7-abc.json").write_text(json.dumps(copied))

    assert [r["date"] for r in ledger.read(str(root))] == ["2026-01-31", "2026-02-01", "2026-02-02"]
    assert ledger.has_ledger(str(root)) and not ledger.has_ledger(str(tmp_path))


def test_an_objects_name_starts_with_its_start_time_and_pid():
    name = ledger.record_object_name("2026-01-31T01:30:05.250000+00:00", 4242)
    assert name.startswith("20260131T013005250000Z-4242-") and name.endswith(".json")
    assert name != ledger.record_object_name("2026-01-31T01:30:05.250000+00:00", 4242)


@pytest.fixture
def gcs_root(tmp_path, monkeypatch):
    """A fresh gs:// output root on the local GCS emulator (tests.gcs_emulator)."""
    (tmp_path / "gcs").mkdir()
    with gcs_emulator.running(tmp_path / "gcs", "bucket") as env:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv(storage.STATE_DIR_ENV, str(tmp_path / "state"))
        yield f"gs://bucket/{uuid.uuid4().hex}/runs"


def test_a_gs_root_keeps_one_object_a_record(gcs_root):
    import tensorflow as tf

    first = ledger.append(gcs_root, record("2026-01-31", "2026-01-31T01:30:00+00:00", pid=11))
    second = ledger.append(gcs_root, record("2026-01-30", "2026-01-31T02:00:00+00:00", pid=12))

    names = sorted(tf.io.gfile.listdir(f"{gcs_root}/{ledger.LEDGER_DIR}"))
    assert [f"{gcs_root}/{ledger.LEDGER_DIR}/{name}" for name in names] == [first, second]
    assert names[0].startswith("20260131T013000000000Z-11-")
    assert not tf.io.gfile.exists(f"{gcs_root}/{ledger.LEDGER_FILE}")
    assert [r["pid"] for r in ledger.read(gcs_root)] == [11, 12]
