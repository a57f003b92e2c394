"""Retention keeps an output root bounded over many nights, never removes what must stay, works
on a store's paths, refuses bad [Retention] settings in one line and records failed removals."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import uuid

import pytest
import tensorflow as tf

from contract import gfile, layout, ledger, pointer, run_lock, storage
from evaluate import served, serving
from pipeline import attempts, gc, retention, retention_config, retention_plan
from tests.factories import PROJECT_ROOT
from tests.pipeline.retention_runs import (
    CHECKPOINT_BYTES,
    MODEL_BYTES,
    SAVED_MODEL_BYTES,
    SHARD_BYTES,
    FakeRoot,
    night_time,
    write,
)

FIRST_NIGHT = datetime.date(2026, 1, 1)
DEFAULTS = retention_config.default_settings()
SMALL_PER_NIGHT = 2_000  # logs, evaluate folder, history, config, tensorboard: never removed
SERVED_VERSION_BYTES = SAVED_MODEL_BYTES + 200
SUPERSEDED_BYTES = MODEL_BYTES + 5_000 + 200


def dates(count: int, start: datetime.date = FIRST_NIGHT) -> list[str]:
    return [(start + datetime.timedelta(days=i)).isoformat() for i in range(count)]


def kind_of_night(i: int) -> str:
    """The year's pattern: a night in ten stops in training, a third of the rest not blessed."""
    if i % 10 == 7:
        return "failed"
    return "not-blessed" if i % 3 == 2 else "blessed"


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    """Locks of URL roots live in a local state folder: one per test."""
    monkeypatch.setenv(storage.STATE_DIR_ENV, str(tmp_path / "state"))


@pytest.fixture
def fake(tmp_path) -> FakeRoot:
    return FakeRoot(str(tmp_path / "runs"))


def run_nights(fake: FakeRoot, count: int, settings=DEFAULTS, gc_each_night: bool = True):
    """Writes `count` nights of the year's pattern, with a forced rerun every 8th night and a
    quarantined retrain every 9th, a retention pass after each; yields (index, date, now)."""
    for i, date in enumerate(dates(count)):
        kind = kind_of_night(i)
        fake.night(date, finished=kind != "failed", blessed=kind == "blessed")
        if i % 8 == 5 and kind != "failed":
            fake.supersede(date, night_time(date, 2))
        if i % 9 == 4 and kind == "blessed":
            fake.quarantine(int(date.replace("-", "")) * 100 + 1, night_time(date, 2))
        now = night_time(date, 4)
        if gc_each_night:
            result = retention.run_pass(fake.target, settings, now=now)
            assert result.errors == []
        yield i, date, now


def bound(nights: int, settings=DEFAULTS) -> int:
    """The largest the root may be after `nights` nights of the pattern, as docs/operations.md
    counts it: kept shard sets, what failed nights keep, models, served and quarantined
    versions, superseded folders, and the small files every night keeps."""
    kinds = [kind_of_night(i) for i in range(nights)]
    failed = kinds.count("failed")
    recent = min(nights, settings.not_blessed_model_days + 1)
    not_blessed_recent = kinds[-recent:].count("not-blessed")
    recent_30 = range(max(0, nights - settings.quarantine_days - 1), nights)
    quarantined = sum(1 for i in recent_30 if i % 9 == 4 and kinds[i] == "blessed")
    superseded = sum(1 for i in recent_30 if i % 8 == 5 and kinds[i] != "failed")
    return (
        settings.keep_shard_sets * SHARD_BYTES
        + failed * (SHARD_BYTES + CHECKPOINT_BYTES)
        + kinds.count("blessed") * MODEL_BYTES
        + not_blessed_recent * MODEL_BYTES
        + settings.keep_served_versions * SERVED_VERSION_BYTES
        + quarantined * SERVED_VERSION_BYTES
        + superseded * SUPERSEDED_BYTES
        + nights * SMALL_PER_NIGHT
    )


def test_forty_nights_stay_under_the_steady_state_bound(fake, tmp_path):
    sizes = []
    for i, _, _ in run_nights(fake, 40):
        sizes.append(fake.size())
        assert sizes[-1] <= bound(i + 1), f"night {i + 1}: {sizes[-1]} > {bound(i + 1)}"
    without = FakeRoot(str(tmp_path / "kept"))
    for _ in run_nights(without, 40, gc_each_night=False):
        pass
    assert without.size() > 2 * bound(40)  # the bound says something


def test_what_each_kind_keeps_after_forty_nights(fake):
    for _ in run_nights(fake, 40):
        pass
    all_dates = dates(40)
    with_data = [d for d in all_dates if gfile.exists(layout.data_dir(fake.root, d))]
    failed = [d for i, d in enumerate(all_dates) if kind_of_night(i) == "failed"]
    finished = [d for d in all_dates if d not in failed]
    assert sorted(set(with_data) - set(failed)) == finished[-DEFAULTS.keep_shard_sets :]
    files = fake.files()
    checkpoints = {f.split("/")[0] for f in files if f.split("/")[1:3] == ["train", "checkpoint"]}
    assert checkpoints == set()
    assert all(f"{d}/train/backup/ckpt-1.index" in files for d in failed)
    blessed = [d for i, d in enumerate(all_dates) if kind_of_night(i) == "blessed"]
    assert all(f"{d}/train/model.keras" in files for d in blessed)  # keep_blessed_models 0
    not_blessed = [d for i, d in enumerate(all_dates) if kind_of_night(i) == "not-blessed"]
    last = datetime.date.fromisoformat(all_dates[-1])
    for date in not_blessed:
        age = (last - datetime.date.fromisoformat(date)).days
        assert (f"{date}/train/model.keras" in files) == (age <= DEFAULTS.not_blessed_model_days)
    assert fake.served() == [int(d.replace("-", "")) * 100 for d in blessed][-10:]
    for date in all_dates:  # logs and evaluations stay
        assert f"{date}/logs/train.log" in files
        assert date in failed or f"{date}/evaluate/report.md" in files


def test_the_ledger_rollbacks_trend_page_and_logs_are_never_removed(fake):
    ledger.append(fake.root, {"date": "2026-01-01", "started_utc": "2026-01-01T03:00:00+00:00"})
    keep = ["rollbacks/20260105T000000Z.json", "index.html", "trend.png", "data_gate/schema.pbtxt"]
    for name in keep:
        write(layout.join(fake.root, name), 100)
    eager = dataclasses.replace(
        DEFAULTS,
        keep_shard_sets=1,
        keep_blessed_models=1,
        not_blessed_model_days=1,
        keep_served_versions=1,
        quarantine_days=1,
        superseded_days=1,
    )
    for _ in run_nights(fake, 20, eager):
        pass
    files = fake.files()
    assert {ledger.LEDGER_FILE, *keep} <= files
    assert {f"{d}/logs/train.log" for d in dates(20)} <= files


# One test per rule of what is never removed; each removes something next to what it keeps.


def test_the_model_latest_json_names_is_kept_past_the_blessed_models_kept(fake):
    first, second, third = dates(3)
    for date in (first, second, third):
        fake.night(date)
    fake.point_at(first, int(first.replace("-", "")) * 100)  # rolled back to the first night
    keep_one = dataclasses.replace(DEFAULTS, keep_blessed_models=1)
    retention.run_pass(fake.target, keep_one, now=night_time(third, 4))
    assert gfile.exists(fake.model(first))
    assert not gfile.exists(fake.model(second))
    assert gfile.exists(fake.model(third))


def test_a_superseded_folder_holding_what_latest_json_names_is_kept(fake):
    date, later = dates(2)
    fake.night(date)
    fake.night(later, blessed=False)
    kept = fake.supersede(date, night_time(date, 1))
    fake.point_at(date, None, model_path=layout.join(kept, "train", layout.MODEL_FILE))
    gone = fake.supersede(later, night_time(later, 1))
    now = night_time(later, 1) + datetime.timedelta(days=DEFAULTS.superseded_days + 1)
    retention.run_pass(fake.target, DEFAULTS, now=now)
    assert gfile.exists(layout.join(kept, "train", layout.MODEL_FILE))
    assert not gfile.exists(gone)


def test_the_served_version_latest_json_names_is_kept_past_the_versions_kept(fake):
    first, second, third = dates(3)
    versions = [fake.night(date) for date in (first, second, third)]
    fake.point_at(first, versions[0])
    keep_one = dataclasses.replace(DEFAULTS, keep_served_versions=1)
    retention.run_pass(fake.target, keep_one, now=night_time(third, 4))
    assert fake.served() == [versions[0], versions[2]]


def test_a_quarantined_version_latest_json_names_is_kept_past_its_days(fake):
    first, second = dates(2)
    for date in (first, second):
        fake.night(date)
    version = int(first.replace("-", "")) * 100
    kept = fake.quarantine(version, night_time(first, 5))
    gone = fake.quarantine(version + 1, night_time(first, 5))
    fake.point_at(first, version)
    now = night_time(second) + datetime.timedelta(days=DEFAULTS.quarantine_days + 1)
    retention.run_pass(fake.target, DEFAULTS, now=now)
    assert gfile.exists(kept) and not gfile.exists(gone)


def test_without_latest_json_the_newest_served_version_is_kept(fake):
    nights = dates(3)
    versions = [fake.night(date, move_pointer=False) for date in nights]
    assert pointer.read(fake.root) is None
    keep_one = dataclasses.replace(DEFAULTS, keep_served_versions=1)
    result = retention.run_pass(fake.target, keep_one, now=night_time(nights[-1], 4))
    assert fake.served() == [versions[-1]]
    assert result.errors == []


def test_nothing_of_an_unfinished_night_is_removed(fake):
    old, *middle, last = dates(40)
    version = fake.night(old, move_pointer=False)  # pushed; its evaluation never finished
    gfile.remove(layout.join(layout.evaluate_dir(fake.root, old), layout.METRICS_FILE))
    fake.supersede(old, night_time(old, 1))
    for date in middle:
        fake.night(date, blessed=False)
    fake.night(last)
    before = {f for f in fake.files() if f.startswith(old)}
    eager = dataclasses.replace(DEFAULTS, keep_shard_sets=1, keep_served_versions=1)
    result = retention.run_pass(fake.target, eager, now=night_time(last, 4))
    assert result.removed  # the other nights' shard sets, checkpoints and models went
    assert {f for f in fake.files() if f.startswith(old)} == before
    assert version is not None and gfile.exists(fake.version_dir(version))


def test_nothing_of_a_date_another_process_holds_is_removed(fake):
    held, *_, last = dates(10)
    for date in dates(10):
        fake.night(date, blessed=False)
    before = {f for f in fake.files() if f.startswith(held)}
    lock = run_lock.RunLock(fake.run_dir(held))  # taken as another process would hold it
    lock.acquire()
    try:
        assert run_lock.in_progress(fake.run_dir(held))
        eager = dataclasses.replace(DEFAULTS, keep_shard_sets=1, not_blessed_model_days=1)
        result = retention.run_pass(fake.target, eager, now=night_time(last, 4))
    finally:
        lock.release()
    assert {f for f in fake.files() if f.startswith(held)} == before
    removed = {item["path"] for item in result.removed}
    assert layout.data_dir(fake.root, dates(10)[1]) in removed


def test_a_date_this_process_holds_is_cleaned_as_its_run_ends(fake, monkeypatch):
    (date,) = dates(1)
    fake.night(date)
    monkeypatch.setattr(run_lock, "_held", {})
    run_lock.hold_for_process(fake.run_dir(date))
    try:
        result = retention.run_pass(fake.target, DEFAULTS, now=night_time(date, 4))
    finally:
        run_lock._release_all()
    assert [item["kind"] for item in result.removed] == [retention_plan.CHECKPOINT]


# The command, the gs:// stand-in, bad settings and failed removals.


def test_a_dry_run_removes_nothing_and_prints_the_same_lines(fake, capsys):
    for _ in run_nights(fake, 12, gc_each_night=False):
        pass
    before = fake.files()
    later = night_time(dates(12)[-1], 4) + datetime.timedelta(days=40)
    argv = ["--output-root", fake.root]
    assert gc.main([*argv, "--dry-run"], now=later) == 0
    would = capsys.readouterr().out.splitlines()
    assert fake.files() == before and not ledger.has_ledger(fake.root)
    assert gc.main(argv, now=later) == 0
    did = capsys.readouterr().out.splitlines()
    assert would and [line.removeprefix("would remove: ") for line in would] == [
        line.removeprefix("removed: ") for line in did
    ]
    assert all(line.startswith("would remove: ") for line in would)
    (record,) = ledger.read(fake.root)
    assert (record["entry_point"], record["outcome"], record["date"]) == ("gc", "succeeded", None)
    assert len(record["retention"]["removed"]) == len(did)
    assert record["retention"]["bytes_freed"] > 12 * CHECKPOINT_BYTES
    assert gc.main(argv, now=later) == 0 and capsys.readouterr().out == ""  # nothing left


def test_a_store_root_loses_the_same_files_as_a_local_one(tmp_path):
    local = FakeRoot(str(tmp_path / "runs"))
    remote = FakeRoot(f"ram://retention-{uuid.uuid4().hex}/runs")
    try:
        settings = dataclasses.replace(DEFAULTS, keep_shard_sets=2, keep_served_versions=2)
        for fake in (local, remote):
            for _ in run_nights(fake, 12, settings):
                pass
        assert remote.files() == local.files()
        failed = {d for i, d in enumerate(dates(12)) if kind_of_night(i) == "failed"}
        finished = [d for d in dates(12) if d not in failed]
        with_data = {f.split("/")[0] for f in remote.files() if f.split("/")[1:2] == ["data"]}
        assert with_data == set(finished[-2:]) | failed
        assert len(remote.served()) == 2
    finally:
        with contextlib.suppress(tf.errors.NotFoundError):  # ram:// says so, and removes it
            tf.io.gfile.rmtree(remote.root)


def run_gc(root: str, config_text: str, *flags: str) -> subprocess.CompletedProcess:
    """`python -m pipeline gc --output-root ROOT` with a luigi.cfg addition."""
    config = os.path.join(os.path.dirname(root), "extra.cfg")
    with open(config, "w") as f:
        f.write(config_text)
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "gc", "--output-root", root, *flags],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env=os.environ | {"LUIGI_CONFIG_PATH": config},
        timeout=120,
    )


@pytest.mark.parametrize(
    ("config_text", "message"),
    [
        (
            "[Retention]\nkeep_shard_set = 3\n",
            "error: luigi.cfg's [Retention] has an unknown key 'keep_shard_set': the settings "
            "are keep_blessed_models, keep_checkpoints, keep_served_versions, keep_shard_sets, "
            "not_blessed_model_days, quarantine_days, superseded_days; fix its name or remove it",
        ),
        (
            "[Retention]\nkeep_served_versions = -1\n",
            "error: [Retention] keep_served_versions is -1: give 0 (keep all) or more in "
            "luigi.cfg's [Retention] (or --Retention-... on the command line)",
        ),
    ],
)
def test_bad_retention_settings_are_refused_in_one_line(fake, config_text, message):
    fake.night("2026-01-01")
    before = fake.files()
    done = run_gc(fake.root, config_text)
    assert (done.returncode, done.stderr.splitlines(), done.stdout) == (2, [message], "")
    assert fake.files() - {ledger.LEDGER_FILE} == before
    (record,) = ledger.read(fake.root)
    assert record["outcome"] == ledger.REFUSED and record["reason"] == message[len("error: ") :]


def test_a_folder_that_is_not_an_output_root_is_refused_in_one_line(tmp_path):
    done = run_gc(str(tmp_path / "nowhere"), "")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("error: ") and "is not an output root" in done.stderr


def test_a_full_run_with_an_unknown_retention_key_is_refused_before_anything_runs(tmp_path):
    root = str(tmp_path / "runs")
    config = tmp_path / "extra.cfg"
    config.write_text("[Retention]\nkeep_everything = true\n")
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "FullRun", "--local-scheduler"]
        + ["--date=2026-01-31", f"--output-root={root}"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env=os.environ | {"LUIGI_CONFIG_PATH": str(config)},
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: luigi.cfg's [Retention] has an unknown key 'keep_everything': the settings are "
        "keep_blessed_models, keep_checkpoints, keep_served_versions, keep_shard_sets, "
        "not_blessed_model_days, quarantine_days, superseded_days; fix its name or remove it"
    ]
    (record,) = ledger.read(root)
    assert record["outcome"] == ledger.REFUSED and "retention" not in record
    assert not os.path.exists(os.path.join(root, "2026-01-31"))


def test_a_full_run_ends_with_a_retention_pass_in_its_ledger_record(fake):
    old, date = "2026-01-30", "2026-01-31"
    fake.night(old)
    fake.night(date)
    # Without the files FullRun compares with its own settings: the date is simply complete.
    gfile.remove(layout.join(layout.data_dir(fake.root, date), layout.MANIFEST_FILE))
    gfile.remove(layout.join(layout.train_dir(fake.root, date), layout.HISTORY_FILE))
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "FullRun", "--local-scheduler"]
        + [f"--date={date}", f"--output-root={fake.root}"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env=os.environ | {"TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = ledger.read(fake.root)
    assert record["outcome"] == ledger.SKIPPED_COMPLETE
    checkpoints = [
        layout.join(layout.train_dir(fake.root, night), layout.FINAL_CHECKPOINT_DIR)
        for night in (date, old)
    ]
    removed = [(item["kind"], item["path"]) for item in record["retention"]["removed"]]
    assert removed == [(retention_plan.CHECKPOINT, path) for path in checkpoints]
    assert record["retention"]["errors"] == []
    assert not any(gfile.exists(path) for path in checkpoints)


def test_a_failed_removal_is_recorded_and_the_others_go_on(fake, monkeypatch):
    for _ in run_nights(fake, 10, gc_each_night=False):
        pass
    stuck = layout.data_dir(fake.root, dates(10)[0])
    real_rmtree = gfile.rmtree

    def rmtree(path: str) -> None:
        if path == stuck:
            raise PermissionError(13, "Permission denied", path)
        real_rmtree(path)

    monkeypatch.setattr(gfile, "rmtree", rmtree)
    result = retention.run_pass(fake.target, DEFAULTS, now=night_time(dates(10)[-1], 4))
    assert result.errors == [{"path": stuck, "error": f"[Errno 13] Permission denied: '{stuck}'"}]
    assert stuck not in {item["path"] for item in result.removed}
    assert not gfile.exists(layout.data_dir(fake.root, dates(10)[1]))
    # What was removed first says the shard set is not there: it is never taken for a whole one.
    assert not gfile.exists(layout.join(stuck, layout.MANIFEST_FILE))


def test_a_failed_removal_is_in_the_nights_ledger_record_and_never_raised(fake, monkeypatch):
    for _ in run_nights(fake, 3, gc_each_night=False):
        pass

    def refuse(path: str) -> None:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(gfile, "rmtree", refuse)
    night = attempts.Attempt(
        task_id="t", entry_point="FullRun", date=dates(3)[-1], output_root=fake.root
    )
    night.succeeded = True
    night.retention = lambda: retention.run_pass(fake.target, DEFAULTS).record()
    monkeypatch.setattr(attempts, "_current", night)
    record = attempts.finish()
    assert record is not None and record["retention"]["errors"]
    assert all("Permission denied" in e["error"] for e in record["retention"]["errors"])
    (written,) = ledger.read(fake.root)
    assert written["retention"] == json.loads(json.dumps(record["retention"]))


def test_the_served_folders_names_agree_with_the_evaluate_stages():
    assert layout.QUARANTINE_SUFFIX == served.QUARANTINE_SUFFIX
    assert layout.QUARANTINE_NOTE_FILE == served.QUARANTINE_NOTE
    assert serving.SAVED_MODEL_PB in retention_plan.SAVED_MODEL_FIRST
    assert serving.PUSH_MARKER.split("/")[0] in retention_plan.SAVED_MODEL_FIRST
    stamp = served._utc_stamp()
    assert datetime.datetime.strptime(stamp, retention_plan.QUARANTINE_STAMP_FORMAT)


def test_a_night_judged_again_today_keeps_its_rejected_model_its_full_days(tmp_path):
    # The verdict's own time, not the night's date, starts a not-blessed model's clock: a
    # forced re-evaluation of an old night does not lose the model it just judged.
    import datetime as dt

    from contract import atomic, layout
    from pipeline import retention_plan

    root = str(tmp_path / "runs")
    model = tmp_path / "runs" / "2026-01-31" / "train" / layout.MODEL_FILE
    model.parent.mkdir(parents=True)
    model.write_bytes(b"m")
    verdict = tmp_path / "runs" / "2026-01-31" / "evaluate" / layout.BLESSING_FILE
    verdict.parent.mkdir(parents=True)
    now = dt.datetime(2026, 11, 27, tzinfo=dt.UTC)
    atomic.write_json_atomic(str(verdict), {"blessed": False, "decided_utc": now.isoformat()})
    assert retention_plan._verdict_time(root, "2026-01-31") == now
    atomic.write_json_atomic(str(verdict), {"blessed": False})
    assert retention_plan._verdict_time(root, "2026-01-31") == dt.datetime(
        2026, 1, 31, tzinfo=dt.UTC
    )
