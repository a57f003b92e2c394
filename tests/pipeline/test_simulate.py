"""`python -m pipeline.simulate`: the fault plan, the checks on a broken root, and a short
simulation with every fault end to end."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys

import pytest

from contract import atomic, layout, ledger, pointer
from pipeline import simulate
from pipeline.simulation import checks, drops, faults, retention_bound
from pipeline.simulation.commands import Attempt
from tests.factories import PROJECT_ROOT

DATE = "2026-01-30"
LATER = "2026-01-31"
MODEL_NAME = "nightly"
RETENTION = {
    "keep_shard_sets": 2,
    "keep_checkpoints": False,
    "keep_blessed_models": 1,
    "not_blessed_model_days": 14,
    "keep_served_versions": 1,
    "quarantine_days": 30,
    "superseded_days": 30,
}


def test_a_fault_plan_is_night_fault_entries_and_a_rollback_may_share_a_night():
    plan = faults.parse("5:kill-train, 9:kill-evaluate,9:rollback,12:missed", nights=20)
    assert plan == {
        5: (faults.KILL_TRAIN,),
        9: (faults.KILL_EVALUATE, faults.ROLLBACK),
        12: (faults.MISSED,),
    }
    assert faults.parse(faults.describe(plan), nights=20) == plan
    assert faults.parse("none", nights=3) == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("5-kill-train", "'5-kill-train' is not NIGHT:FAULT"),
        ("5:explode", "unknown fault 'explode'; the faults are kill-train, kill-evaluate"),
        ("0:kill-train", "night 0 is outside the simulation's nights 1-9"),
        ("10:kill-train", "night 10 is outside"),
        ("9:missed", "night 9: a missed night needs a night after it"),
        ("1:drifted-drop", "night 1: drifted-drop needs a night before it"),
        ("3:kill-train,3:corrupt-drop", "night 3 has kill-train and corrupt-drop"),
        ("3:rollback,3:rollback", "night 3 names the same fault twice"),
    ],
)
def test_a_plan_that_cannot_run_is_refused_naming_its_entry(text, message):
    with pytest.raises(faults.FaultPlanError, match="^--faults") as refused:
        faults.parse(text, nights=9)
    assert message in str(refused.value)


def test_the_default_plan_has_every_fault_once_spread_over_the_nights():
    plan = faults.default_plan(60)
    assert sorted(f for night in plan.values() for f in night) == sorted(faults.FAULTS)
    nights = sorted(plan)
    assert nights[0] > 1 and nights[-1] < 60
    assert min(b - a for a, b in zip(nights, nights[1:], strict=False)) > 5
    faults.check(plan, 60)
    assert faults.default_plan(7) == faults.COMPACT_PLAN  # the fewest nights with each fault
    faults.check(faults.COMPACT_PLAN, 7)
    with pytest.raises(faults.FaultPlanError, match="needs at least 7 nights, got 3"):
        faults.default_plan(3)


def test_a_corrupt_drop_is_cut_inside_a_record_never_between_two(tmp_path):
    path = tmp_path / "part-00000.tfrecord"
    lengths = [100, 7, 300, 50, 50]
    starts, data = [], b""
    for length in lengths:  # TFRecord framing: length, its CRC, data, the data's CRC
        starts.append(len(data))
        data += length.to_bytes(8, "little") + b"\0" * 4 + b"x" * length + b"\0" * 4
    path.write_bytes(data)
    for share in (0.0, 0.3, 0.6, 0.99):
        cut = drops.inside_a_record(str(path), share)
        assert cut not in [*starts, len(data)] and 0 < cut < len(data)


def _blessed_night(root, date: str, version: int) -> None:
    """A blessed, pushed night as evaluate leaves it: model, verdict, metrics, served version."""
    model = layout.join(layout.train_dir(str(root), date), layout.MODEL_FILE)
    os.makedirs(os.path.dirname(model))
    with open(model, "wb") as f:
        f.write(date.encode())
    sha = atomic.sha256_file(model)
    evaluate_dir = layout.evaluate_dir(str(root), date)
    os.makedirs(evaluate_dir)
    atomic.write_json_atomic(layout.join(evaluate_dir, layout.BLESSING_FILE), {"blessed": True})
    metrics = {"accuracy": 0.8, "num_examples": 5, "model": {"path": model, "sha256": sha}}
    atomic.write_json_atomic(layout.join(evaluate_dir, layout.METRICS_FILE), metrics)
    push = {"pushed": True, "version": version}
    atomic.write_json_atomic(layout.join(evaluate_dir, layout.PUSH_FILE), push)
    marker = layout.join(str(root), "serving", MODEL_NAME, str(version), "assets.extra")
    os.makedirs(marker)
    atomic.write_json_atomic(
        layout.join(marker, "nightly_push.json"),
        {"model_sha256": sha, "date": date, "version": version},
    )
    pointer.write(
        str(root),
        {
            "date": date,
            "model_path": model,
            "model_sha256": sha,
            "metrics_path": layout.join(evaluate_dir, layout.METRICS_FILE),
            "version": version,
        },
    )


def test_the_served_check_fails_on_a_served_version_newer_than_the_pointers(tmp_path):
    from evaluate import served

    _blessed_night(tmp_path, DATE, 2026013000)
    export_base = str(tmp_path / "serving")
    check = checks.served({"problems": served.problems(str(tmp_path), export_base, MODEL_NAME)})
    assert check.ok
    # A push whose pointer move never happened: the newer version has no blessed night.
    newer = tmp_path / "serving" / MODEL_NAME / "2026013100"
    (newer / "assets.extra").mkdir(parents=True)
    (newer / "assets.extra" / "nightly_push.json").write_text(json.dumps({"model_sha256": "x"}))
    check = checks.served({"problems": served.problems(str(tmp_path), export_base, MODEL_NAME)})
    assert not check.ok and check.name == checks.SERVED
    assert "the newest served version is 2026013100, not 2026013000" in check.detail


def _state(served_accuracy: float, examples: int = 500) -> dict:
    return {
        "problems": [],
        "date": DATE,
        "version": 2026013000,
        "newest_version": 2026013000,
        "metrics_accuracy": 0.8123,
        "metrics_examples": 500,
        "served_accuracy": served_accuracy,
        "served_examples": examples,
    }


def test_the_scores_check_holds_only_when_the_served_model_scores_as_recorded():
    assert checks.scores(_state(0.8123 + 5e-7)).ok
    assert not checks.scores(_state(0.8103)).ok
    assert not checks.scores(_state(0.8123, examples=499)).ok
    assert checks.scores({"version": None}).detail == "nothing served yet"


def _attempt(date: str, pid: int, exit_code: int = 0, killed_in: str | None = None) -> Attempt:
    return Attempt(date, "FullRun", pid, exit_code, 1.0, "log", killed_in=killed_in)


def _record(date: str, pid: int, outcome: str, stage: str | None = None) -> dict:
    return {
        "date": date,
        "entry_point": "FullRun",
        "started_utc": f"{date}T01:30:00+00:00",
        "pid": pid,
        "outcome": outcome,
        "stage": stage,
    }


def test_the_ledger_check_wants_one_record_per_attempt_a_killed_one_without_its_end():
    attempts = [_attempt(DATE, 11, killed_in="Train"), _attempt(DATE, 12), _attempt(LATER, 13, 30)]
    killed = _record(DATE, 11, ledger.FAILED, "FullRun") | {"ended_without_record": True}
    records = [
        killed,
        _record(DATE, 12, ledger.BLESSED),
        _record(LATER, 13, ledger.FAILED, "Preprocess"),
    ]
    assert checks.ledger_records(records, attempts).ok
    assert checks.alert_for(killed) is None
    check = checks.ledger_records(records[:2], attempts)
    assert not check.ok and f"0 records of {LATER}'s attempt (pid 13)" in check.detail
    check = checks.ledger_records([_record(DATE, 11, ledger.FAILED), *records[1:]], attempts)
    assert (
        not check.ok and f"the SIGKILLed attempt of {DATE} does not read as ended" in check.detail
    )
    check = checks.ledger_records([killed, _record(DATE, 12, ledger.FAILED), records[2]], attempts)
    assert not check.ok and "exited 0, its record says failed" in check.detail


def test_the_alerts_check_names_what_is_missing_unexpected_or_repeated():
    expected = {(DATE, "failed"), (LATER, "missed")}
    received = {"webhook": [(DATE, "failed"), (LATER, "missed")], "email": [(LATER, "missed")]}
    check = checks.alerts(received, expected)
    assert not check.ok and check.detail == f"email missing: {DATE} failed"
    received["email"] += [(DATE, "failed"), (DATE, "failed"), (LATER, "not-blessed")]
    check = checks.alerts(received, expected)
    assert f"email unexpected: {LATER} not-blessed" in check.detail
    assert f"email repeated: {DATE} failed" in check.detail
    assert checks.alerts({"webhook": received["webhook"]}, expected).ok
    assert checks.alert_for(_record(DATE, 1, ledger.FAILED, "DataGate")) == (
        DATE,
        "data-gate-anomaly",
    )
    assert checks.alert_for(_record(DATE, 1, ledger.BLESSED)) is None


def test_the_outcome_and_status_checks_follow_the_nights_fault():
    failed = [_record(DATE, 1, ledger.FAILED, "Preprocess")]
    assert checks.outcome((faults.CORRUPT_DROP,), failed).ok
    check = checks.outcome((faults.DRIFTED_DROP,), failed)
    assert not check.ok and check.detail == "failed in Preprocess, expected failed in DataGate"
    assert not checks.outcome((), failed).ok
    assert checks.outcome((faults.MISSED,), []).ok
    missing = {"nights": [{"date": DATE, "outcome": "missing"}]}
    assert checks.status_answer(1, missing, DATE, "missing").ok
    assert not checks.status_answer(0, missing, DATE, "missing").ok


def test_the_disk_check_counts_each_kind_against_its_retention_setting(tmp_path):
    for date in ("2026-01-27", "2026-01-28", "2026-01-29", DATE):
        (tmp_path / date / "data").mkdir(parents=True)
        (tmp_path / date / "data" / "shard.tfrecord").write_bytes(b"x" * 1000)
        (tmp_path / date / "evaluate").mkdir()
        (tmp_path / date / "evaluate" / "metrics.json").write_text("{}")
    (tmp_path / DATE / "train" / "backup").mkdir(parents=True)
    (tmp_path / DATE / "train" / "backup" / "ckpt").write_bytes(b"x" * 10)
    today = datetime.date(2026, 1, 31)
    served_dir = str(tmp_path / "serving" / MODEL_NAME)
    occupancy = retention_bound.occupancy(str(tmp_path), served_dir, RETENTION, today)
    check = checks.disk(occupancy)
    assert not check.ok
    assert "4 shard sets, over the 2 retention keeps" in check.detail
    assert f"{DATE}, evaluated, still has train/backup/" in check.detail
    assert occupancy.bound_bytes < occupancy.total_bytes
    for date in ("2026-01-27", "2026-01-28"):
        for name in ("shard.tfrecord",):
            os.remove(tmp_path / date / "data" / name)
        os.rmdir(tmp_path / date / "data")
    os.remove(tmp_path / DATE / "train" / "backup" / "ckpt")
    os.rmdir(tmp_path / DATE / "train" / "backup")
    occupancy = retention_bound.occupancy(str(tmp_path), served_dir, RETENTION, today)
    assert checks.disk(occupancy).ok and occupancy.total_bytes <= occupancy.bound_bytes


@pytest.mark.e2e
def test_own_processes_turns_the_fork_server_off(tmp_path):
    args = ["--nights", "3", "--faults", "none", "--root", str(tmp_path / "sim")]
    assert simulate.parse_args(args)[0].fork_server
    assert not simulate.parse_args([*args, "--own-processes"])[0].fork_server


def test_seven_nights_with_every_fault_pass_every_check(tmp_path):
    root = tmp_path / "sim"
    command = [
        sys.executable, "-m", "pipeline.simulate", "--nights", "7", "--root", str(root),
        "--faults", faults.describe(faults.COMPACT_PLAN), "--per-day", "300",
    ]  # fmt: skip
    env = os.environ | {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = (root / "simulation.md").read_text()
    assert "Every check passed on all 7 nights." in report
    assert "- stages: forked from one warm fork server" in report
    rows = [line for line in report.splitlines() if line.startswith("| ") and "night" not in line]
    assert len(rows) == 7
    wanted = {
        1: "killed in Train",
        2: "rolled back to",
        3: "not run",
        4: "failed",
        5: "data-gate-anomaly",
        6: "not-blessed",
        7: "on a full disk",
    }
    for number, text in wanted.items():
        assert text in rows[number - 1], rows[number - 1]
    assert "killed in Evaluate" in rows[1]


def test_the_disk_check_counts_a_not_blessed_models_days_from_its_verdict(tmp_path):
    served_dir = str(tmp_path / "serving" / MODEL_NAME)
    today = datetime.date(2026, 3, 1)
    for date, decided in (("2026-01-10", "2026-02-20T01:30:00+00:00"), (DATE, None)):
        (tmp_path / date / "evaluate").mkdir(parents=True)
        (tmp_path / date / "evaluate" / "metrics.json").write_text("{}")
        verdict = {"blessed": False} | ({"decided_utc": decided} if decided else {})
        (tmp_path / date / "evaluate" / "blessing.json").write_text(json.dumps(verdict))
        (tmp_path / date / "train").mkdir()
        (tmp_path / date / "train" / "model.keras").write_bytes(b"m")
    # 2026-01-10, judged on 2026-02-20, is 9 days past its verdict: kept. DATE's verdict has
    # no time, so its date counts: 30 days, over the 14.
    check = checks.disk(retention_bound.occupancy(str(tmp_path), served_dir, RETENTION, today))
    assert not check.ok
    assert f"{DATE}'s model, not blessed, was judged 30 days ago (over 14)" in check.detail
    assert "2026-01-10" not in check.detail
