"""contract.atomic's file writers: a reader sees the old file or the whole new one, never half."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from contract import atomic


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "folder" / "shard.tfrecord"
    atomic.write_file_atomic(str(path), lambda tmp: Path(tmp).write_bytes(b"old"))

    def half_then_fail(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(b"ne")
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        atomic.write_file_atomic(str(path), half_then_fail)
    assert path.read_bytes() == b"old"
    assert os.listdir(path.parent) == ["shard.tfrecord"]


def test_copy_makes_the_target_folder_and_replaces_the_target(tmp_path):
    source = tmp_path / "model.keras"
    source.write_bytes(b"weights")
    target = tmp_path / "train" / "final" / "model.keras"
    atomic.copy_atomic(str(source), str(target))
    source.write_bytes(b"better weights")
    atomic.copy_atomic(str(source), str(target))
    assert target.read_bytes() == b"better weights"
    assert os.listdir(target.parent) == ["model.keras"]
