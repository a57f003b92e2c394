"""Files that mark completion reach the disk before their rename, and their folder after it;
the backup is deleted only after the train folder is flushed, and a replaced shard set only
after the new one's folder is."""

from __future__ import annotations

import os
from typing import Any

import pytest
import tensorflow as tf

from contract import atomic, layout, manifest, pointer
from preprocess import shard_set
from train import artifacts


@pytest.fixture
def disk_events(monkeypatch) -> list[tuple[str, ...]]:
    """Every fsync (of the path its descriptor names) and rename, in order."""
    events: list[tuple[str, ...]] = []
    fsync, replace = os.fsync, os.replace

    def recorded_fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recorded_replace(source: Any, target: Any) -> None:
        events.append(("rename", str(source), str(target)))
        replace(source, target)

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.setattr(os, "replace", recorded_replace)
    return events


def _renamed_durably(events: list[tuple[str, ...]], path: str) -> None:
    """The file was flushed, renamed to `path`, then its folder flushed: in that order."""
    renames = [e for e in events if e[0] == "rename" and e[2] == path]
    assert len(renames) == 1, events
    at = events.index(renames[0])
    tmp = renames[0][1]
    assert ("fsync", tmp) in events[:at], f"{tmp} not flushed before its rename: {events}"
    assert ("fsync", os.path.dirname(path)) in events[at + 1 :], events


def test_an_atomic_write_is_flushed_around_its_rename(tmp_path, disk_events):
    path = str(tmp_path / layout.HISTORY_FILE)
    atomic.write_json_atomic(path, {"epochs_completed": 3})
    _renamed_durably(disk_events, path)
    assert atomic.read_json(path) == {"epochs_completed": 3}


def test_the_latest_pointer_is_flushed_around_its_rename(tmp_path, disk_events):
    pointer.write(str(tmp_path), {"date": "2026-01-31", "model_path": "m", "accuracy": 0.9})
    _renamed_durably(disk_events, pointer.pointer_path(str(tmp_path)))


def test_a_copied_model_and_its_new_folder_are_flushed(tmp_path, disk_events):
    source = tmp_path / "scratch.keras"
    source.write_bytes(b"model")
    target = str(tmp_path / "train" / "final_checkpoint" / "ckpt.index")
    atomic.copy_atomic(str(source), target)
    _renamed_durably(disk_events, target)
    assert ("fsync", str(tmp_path / "train")) in disk_events  # the new folder's name
    with open(target, "rb") as f:
        assert f.read() == b"model"


def test_the_backup_goes_only_after_the_train_folder_is_flushed(tmp_path, monkeypatch):
    train_dir = str(tmp_path / "train")
    backup = os.path.join(train_dir, layout.BACKUP_DIR)
    os.makedirs(backup)
    atomic.write_json_atomic(os.path.join(train_dir, layout.HISTORY_FILE), {})
    flushed_with_backup: list[bool] = []
    fsync = os.fsync

    def recorded_fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == train_dir:
            flushed_with_backup.append(os.path.exists(backup))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    artifacts.remove_backup(train_dir)
    assert not os.path.exists(backup)
    assert flushed_with_backup == [True]


def test_a_shard_set_is_flushed_before_the_rename_that_publishes_it(
    tmp_path, disk_events, monkeypatch
):
    final = str(tmp_path / "runs" / "2026-01-31" / "data")
    os.makedirs(final)
    with open(os.path.join(final, layout.MANIFEST_FILE), "w") as f:
        f.write("{}")  # an earlier set, replaced
    staging = f"{final}.tmp-0123456789ab"
    shard = os.path.join(staging, layout.worker_file_name(0, 1, 0, 1))
    statistics = os.path.join(staging, manifest.STATISTICS_FILE)
    os.makedirs(os.path.dirname(shard))
    for path in (shard, statistics):
        with open(path, "wb") as f:
            f.write(b"records")
    rmtree = tf.io.gfile.rmtree

    def recorded_rmtree(path: str) -> None:
        disk_events.append(("remove", path))
        rmtree(path)

    monkeypatch.setattr(tf.io.gfile, "rmtree", recorded_rmtree)
    doc = {"files": [{"path": layout.worker_file_name(0, 1, 0, 1)}]}
    shard_set.publish(staging, final, doc)

    renames = [e for e in disk_events if e[0] == "rename" and e[2] == final]
    assert renames == [("rename", staging, final)], disk_events
    at = disk_events.index(renames[0])
    for path in (shard, statistics, os.path.dirname(shard), staging):
        assert ("fsync", path) in disk_events[:at], f"{path} not flushed first: {disk_events}"
    manifest_path = os.path.join(staging, layout.MANIFEST_FILE)
    _renamed_durably(disk_events[:at], manifest_path)
    parent = ("fsync", os.path.dirname(final))
    assert parent in disk_events[at + 1 :], disk_events
    flushed = disk_events.index(parent, at + 1)
    removed = [i for i, e in enumerate(disk_events) if e[0] == "remove" and ".old-" in e[1]]
    assert len(removed) == 1 and removed[0] > flushed, disk_events  # the old set goes last
    assert atomic.read_json(os.path.join(final, layout.MANIFEST_FILE)) == doc
    assert sorted(os.listdir(os.path.dirname(final))) == ["data"]
