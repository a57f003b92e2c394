"""Forcing a stage moves it and its dependants aside, keeps earlier stages and the old files."""

from __future__ import annotations

import datetime
import os

import pytest

from contract import atomic, layout
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


def test_latest_pointer_follows_a_moved_model(run_root):
    pointer_path = os.path.join(run_root, layout.LATEST_POINTER_FILE)
    model = os.path.abspath(os.path.join(run_root, DATE, "train", "model.keras"))
    atomic.write_json_atomic(pointer_path, {"date": DATE, "model_path": model, "accuracy": 0.9})
    destination = supersede.supersede(run_root, DATE, "train", now=NOW)
    pointer = atomic.read_json(pointer_path)
    assert pointer["model_path"] == os.path.abspath(os.path.join(destination, "train/model.keras"))
    assert os.path.exists(pointer["model_path"])
    assert pointer["accuracy"] == 0.9 and pointer["date"] == DATE


def test_latest_pointer_of_another_run_is_untouched(run_root):
    pointer_path = os.path.join(run_root, layout.LATEST_POINTER_FILE)
    other = {"date": "2026-01-30", "model_path": "/elsewhere/model.keras", "accuracy": 0.9}
    atomic.write_json_atomic(pointer_path, other)
    supersede.supersede(run_root, DATE, "train", now=NOW)
    assert atomic.read_json(pointer_path) == other


def test_remote_output_root_is_refused_with_advice():
    with pytest.raises(ValueError, match="local output roots only, not gs://bucket/runs"):
        supersede.supersede("gs://bucket/runs", DATE, "train")
