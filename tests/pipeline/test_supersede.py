"""Forcing a stage moves it and its dependants aside, keeps earlier stages and the old files."""

from __future__ import annotations

import datetime
import os
import uuid

import pytest
import tensorflow as tf

from contract import atomic, layout, pointer, storage
from pipeline import supersede

DATE = "2026-01-31"
NOW = datetime.datetime(2026, 2, 1, 3, 4, 5, 600_000, tzinfo=datetime.UTC)
STAMP = "20260201T030405.600000Z"


@pytest.fixture
def run_root(tmp_path):
    root = str(tmp_path / "runs")
    for name, file in (
        ("data", "manifest.json"),
        ("train", "model.keras"),
        ("evaluate", "metrics.json"),
    ):
        folder = os.path.join(root, DATE, name)
        os.makedirs(folder)
        with open(os.path.join(folder, file), "w") as f:
            f.write(name)
    return root


def _tree(root: str) -> set[str]:
    run = os.path.join(root, DATE)
    return {os.path.relpath(os.path.join(d, f), run) for d, _, files in os.walk(run) for f in files}


@pytest.mark.parametrize(
    ("stage", "moved"),
    [
        ("preprocess", ["data/manifest.json", "train/model.keras", "evaluate/metrics.json"]),
        ("train", ["train/model.keras", "evaluate/metrics.json"]),
        ("evaluate", ["evaluate/metrics.json"]),
    ],
)
def test_moves_the_stage_and_what_follows(run_root, stage, moved):
    before = _tree(run_root)
    destination = supersede.supersede(run_root, DATE, stage, now=NOW)
    assert destination == os.path.join(run_root, DATE, "superseded", STAMP)
    after = _tree(run_root)
    assert after == (before - set(moved)) | {f"superseded/{STAMP}/{m}" for m in moved}
    with open(os.path.join(destination, moved[0])) as f:
        assert f.read() == moved[0].split("/")[0]


def test_nothing_to_move(tmp_path):
    assert supersede.supersede(str(tmp_path), DATE, "train") is None
    assert os.listdir(tmp_path) == []


def test_unknown_stage_is_named():
    with pytest.raises(ValueError, match="unknown stage 'trian': choose one of preprocess, train"):
        supersede.stages_from("trian")


@pytest.mark.parametrize("stored", ["absolute", "relative"])
def test_latest_pointer_follows_a_moved_model(run_root, stored):
    model = os.path.abspath(os.path.join(run_root, DATE, "train", "model.keras"))
    if stored == "absolute":  # as older versions wrote it
        atomic.write_json_atomic(
            pointer.pointer_path(run_root), {"date": DATE, "model_path": model, "accuracy": 0.9}
        )
    else:
        pointer.write(run_root, {"date": DATE, "model_path": model, "accuracy": 0.9})
    supersede.supersede(run_root, DATE, "train", now=NOW)
    moved = pointer.read(run_root)
    assert moved is not None
    assert moved["model_path"] == f"{DATE}/superseded/{STAMP}/train/model.keras"
    assert os.path.exists(pointer.resolve(run_root, moved["model_path"]))
    assert moved["accuracy"] == 0.9 and moved["date"] == DATE


def test_latest_pointer_of_another_run_is_untouched(run_root):
    pointer_path = os.path.join(run_root, layout.LATEST_POINTER_FILE)
    other = {"date": "2026-01-30", "model_path": "/elsewhere/model.keras", "accuracy": 0.9}
    atomic.write_json_atomic(pointer_path, other)
    supersede.supersede(run_root, DATE, "train", now=NOW)
    assert atomic.read_json(pointer_path) == other


@pytest.fixture
def remote_root(tmp_path, monkeypatch):
    """A run under a URL root (TensorFlow's in-memory ram:// filesystem stands in for gs://)."""
    monkeypatch.setenv(storage.STATE_DIR_ENV, str(tmp_path / "state"))
    root = f"ram://supersede-{uuid.uuid4().hex}/runs"
    for name, file in (
        ("data", "manifest.json"),
        ("train", "history.json"),
        ("train", "backup/checkpoint.index"),
        ("evaluate", "metrics.json"),
    ):
        path = f"{root}/{DATE}/{name}/{file}"
        tf.io.gfile.makedirs(path.rsplit("/", 1)[0])
        atomic.write_bytes_atomic(path, name.encode())
    yield root
    tf.io.gfile.rmtree(root)


def test_remote_stage_moves_file_by_file_marker_first(remote_root, monkeypatch):
    renamed = []
    rename = tf.io.gfile.rename

    def recorded_rename(source: str, target: str, overwrite: bool = False) -> None:
        renamed.append(source)
        rename(source, target, overwrite)

    monkeypatch.setattr(tf.io.gfile, "rename", recorded_rename)
    pointer.write(
        remote_root, {"date": DATE, "model_path": f"{remote_root}/{DATE}/train/model.keras"}
    )
    destination = supersede.supersede(remote_root, DATE, "train", now=NOW)
    assert destination == f"{remote_root}/{DATE}/superseded/{STAMP}"
    run = f"{remote_root}/{DATE}"
    assert [p[len(run) + 1 :] for p in renamed if p.startswith(run)] == [
        "train/history.json",  # the completion marker first: a half move reruns the stage
        "train/backup/checkpoint.index",
        "evaluate/metrics.json",
    ]
    left = [name for _, _, names in tf.io.gfile.walk(f"{run}/train") for name in names]
    assert left == [] and tf.io.gfile.exists(f"{run}/data/manifest.json")
    assert tf.io.gfile.exists(f"{destination}/train/backup/checkpoint.index")
    moved = pointer.read(remote_root)
    assert moved is not None
    assert moved["model_path"] == f"{DATE}/superseded/{STAMP}/train/model.keras"
    lock = os.path.join(storage.local_state_dir(remote_root), "latest.json.lock")
    assert os.path.exists(lock)  # the pointer's lock is a local file, per machine


def _evaluated_night(root: str, date: str, accuracy: float) -> None:
    folder = layout.evaluate_dir(root, date)
    os.makedirs(folder, exist_ok=True)
    atomic.write_json_atomic(
        os.path.join(folder, layout.METRICS_FILE),
        {"date": date, "accuracy": accuracy, "loss": 0.5},
    )


def test_a_forced_evaluation_leaves_the_trend_page_at_once(tmp_path):
    from pipeline.full_run import rewrite_trend_page

    root = str(tmp_path / "runs")
    _evaluated_night(root, "2026-01-30", 0.91)
    _evaluated_night(root, DATE, 0.92)
    rewrite_trend_page(root)
    with open(os.path.join(root, "index.html")) as f:
        page = f.read()
    assert 'id="night-2026-01-30"' in page and f'id="night-{DATE}"' in page

    supersede.supersede(root, DATE, "evaluate")
    rewrite_trend_page(root)
    with open(os.path.join(root, "index.html")) as f:
        page = f.read()
    assert 'id="night-2026-01-30"' in page
    assert f'id="night-{DATE}"' not in page  # superseded: not current until its rerun ends
