"""An attempt files a start record as it begins: one killed before its end reads back as one
failed record ("ended without a record"), one still running is left out (or shown running),
and a finished one is still one record, on a local root and on a store."""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import uuid

import psutil

from contract import ledger
from evaluate import trend
from pipeline import status
from tests.factories import PROJECT_ROOT
from tests.waiting import wait_until

# The stages must be the luigi process's own descendants here (conftest.own_processes).
OWN_PROCESSES = True
DATE = "2026-01-31"


def start_record(**fields) -> dict:
    now = datetime.datetime.now(datetime.UTC)
    return {
        "attempt_id": uuid.uuid4().hex,
        "date": DATE,
        "entry_point": "FullRun",
        "started_utc": now.isoformat(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "command": "luigi --module pipeline FullRun",
        **fields,
    }


def ago(**delta) -> str:
    return (datetime.datetime.now(datetime.UTC) - datetime.timedelta(**delta)).isoformat()


def test_an_attempt_still_running_is_left_out_unless_asked_for(tmp_path):
    ledger.begin(str(tmp_path), start_record())  # this process: alive
    assert ledger.read(str(tmp_path)) == []
    (running,) = ledger.read(str(tmp_path), running=True)
    assert running["outcome"] == ledger.RUNNING and "phase" not in running


def test_a_start_record_whose_process_is_gone_reads_as_failed(tmp_path):
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    ledger.begin(str(tmp_path), start_record(pid=int(gone.stdout)))
    (record,) = ledger.read(str(tmp_path), running=True)
    assert (record["outcome"], record["stage"]) == (ledger.FAILED, "FullRun")
    assert record["reason"] == ledger.ENDED_WITHOUT_RECORD and record["ended_without_record"]
    assert record["ended_utc"] is None and record["date"] == DATE


def test_a_pid_reused_by_a_later_process_is_not_the_attempt(tmp_path):
    # This process started long after the record: the attempt that had its pid is gone.
    ledger.begin(str(tmp_path), start_record(started_utc=ago(days=400)))
    (record,) = ledger.read(str(tmp_path))
    assert record["outcome"] == ledger.FAILED


def test_another_hosts_attempt_counts_as_running_for_a_day(tmp_path):
    ledger.begin(str(tmp_path), start_record(host="elsewhere", started_utc=ago(hours=2)))
    ledger.begin(str(tmp_path), start_record(host="elsewhere", started_utc=ago(hours=30)))
    outcomes = [r["outcome"] for r in ledger.read(str(tmp_path), running=True)]
    assert outcomes == [ledger.FAILED, ledger.RUNNING]  # in order of start


def test_an_ended_attempt_is_one_record_its_end(tmp_path):
    start = start_record()
    ledger.begin(str(tmp_path), start)
    ledger.append(str(tmp_path), start | {"outcome": ledger.BLESSED, "ended_utc": ago(seconds=0)})
    (record,) = ledger.read(str(tmp_path), running=True)
    assert record["outcome"] == ledger.BLESSED
    lines = (tmp_path / ledger.LEDGER_FILE).read_text().splitlines()
    assert [json.loads(line).get("phase") for line in lines] == [ledger.STARTED, None]


def test_on_a_store_the_start_object_goes_once_the_end_is_written():
    import tensorflow as tf

    root = f"ram://ledger-{uuid.uuid4().hex}/runs"
    start = start_record()
    begun = ledger.begin(root, start)
    killed = ledger.begin(root, start_record(started_utc=ago(days=400)))
    ledger.append(root, start | {"outcome": ledger.NOT_BLESSED}, replaces=begun)
    names = tf.io.gfile.listdir(f"{root}/{ledger.LEDGER_DIR}")
    assert len(names) == 2 and killed.rsplit("/", 1)[-1] in names
    assert sorted(r["outcome"] for r in ledger.read(root)) == [ledger.FAILED, ledger.NOT_BLESSED]


def luigi_processes(pid: int) -> list[psutil.Process]:
    try:
        return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def test_a_sigkilled_night_shows_failed_in_the_ledger_and_status(tmp_path, capsys):
    root = tmp_path / "runs"
    fifo = tmp_path / "stuck.tfrecord"
    os.mkfifo(fifo)  # a stage reading it never ends: the night is under way until killed
    night = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "FullRun", "--local-scheduler", f"--date={DATE}"]
        + [f"--output-root={root}", f"--dataset=tfrecord:{fifo}"],
        cwd=PROJECT_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=os.environ | {"TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    try:
        wait_until(
            lambda: (root / DATE / "logs" / "preprocess.log").exists(),
            timeout=120,
            alive=lambda: night.poll() is None,
            failure=lambda: f"the night never started its stage (exit {night.poll()})",
        )
        (running,) = ledger.read(str(root), running=True)
        assert running["outcome"] == ledger.RUNNING and ledger.read(str(root)) == []
        tree = luigi_processes(night.pid)
        os.kill(night.pid, signal.SIGKILL)
        night.wait()
    finally:
        if night.poll() is None:
            night.kill()
            night.wait()
    (record,) = ledger.read(str(root))
    assert (record["outcome"], record["pid"]) == (ledger.FAILED, night.pid)
    assert record["reason"] == ledger.ENDED_WITHOUT_RECORD
    (unfinished,) = trend.read_unfinished(str(root), set())  # the trend page's row
    assert (unfinished.date, unfinished.outcome) == (DATE, ledger.FAILED)
    assert unfinished.reason == f"FullRun: {ledger.ENDED_WITHOUT_RECORD}"

    assert status.main(["--output-root", str(root), "--today", DATE, "--nights", "1"]) == 1
    out, err = capsys.readouterr()
    (row,) = out.splitlines()[1:]
    assert row.split()[:2] == [DATE, ledger.FAILED]
    assert row.endswith(f"FullRun: {ledger.ENDED_WITHOUT_RECORD}")
    assert f"python -m pipeline catch-up --since {DATE}" in err
    for process in tree:  # the stage's group goes with its luigi
        wait_until(
            lambda p=process: not p.is_running() or p.status() == psutil.STATUS_ZOMBIE,
            timeout=90,
            failure=lambda p=process: f"{p.pid} outlived the killed night",
        )


def test_status_shows_a_night_under_way_as_running_and_offers_no_rerun(tmp_path, capsys):
    ledger.begin(str(tmp_path), start_record())
    assert status.main(["--output-root", str(tmp_path), "--today", DATE, "--nights", "1"]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[1].split()[:2] == [DATE, ledger.RUNNING]
    assert "catch-up" not in err
