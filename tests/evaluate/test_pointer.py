"""contract.pointer: relative paths, old absolute pointers, completeness and the shared lock."""

from __future__ import annotations

import fcntl
import os

from contract import atomic, pointer


def _pointer(root: str) -> dict[str, object]:
    return {
        "date": "2026-01-31",
        "model_path": os.path.join(root, "2026-01-31", "train", "model.keras"),
        "model_sha256": "0" * 64,
        "accuracy": 0.9,
        "loss": 0.3,
        "dataset": "fashion_mnist",
        "metrics_path": os.path.join(root, "2026-01-31", "evaluate", "metrics.json"),
        "updated_utc": "2026-01-31T00:00:00+00:00",
    }


def test_write_stores_paths_relative_to_the_root(tmp_path) -> None:
    root = str(tmp_path)
    pointer.write(root, _pointer(root))
    stored = pointer.read(root)
    assert stored is not None
    assert stored["model_path"] == os.path.join("2026-01-31", "train", "model.keras")
    assert pointer.resolve(root, stored["model_path"]) == _pointer(root)["model_path"]


def test_old_absolute_pointer_still_resolves(tmp_path) -> None:
    root = str(tmp_path)
    atomic.write_json_atomic(pointer.pointer_path(root), _pointer(root))
    stored = pointer.read(root)
    assert stored is not None
    assert pointer.resolve(root, stored["model_path"]) == _pointer(root)["model_path"]


def test_pointer_is_complete_only_with_its_metrics(tmp_path) -> None:
    root = str(tmp_path)
    pointer.write(root, _pointer(root))
    stored = pointer.read(root)
    assert stored is not None
    assert not pointer.is_complete(root, stored)
    metrics = tmp_path / "2026-01-31" / "evaluate" / "metrics.json"
    metrics.parent.mkdir(parents=True)
    metrics.write_text("{}")
    assert pointer.is_complete(root, stored)


def test_pointer_without_metrics_path_counts_as_complete(tmp_path) -> None:
    assert pointer.is_complete(str(tmp_path), {"date": "2026-01-30", "accuracy": 0.9})


def test_read_before_the_first_blessing_is_none(tmp_path) -> None:
    assert pointer.read(str(tmp_path)) is None


def test_lock_is_exclusive_while_held(tmp_path) -> None:
    root = str(tmp_path)
    with pointer.pointer_lock(root), open(pointer.pointer_path(root) + ".lock", "a") as other:
        try:
            fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            taken = True
        except BlockingIOError:
            taken = False
    assert not taken
    with open(pointer.pointer_path(root) + ".lock", "a") as other:
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
