"""The Luigi Train task: parameters onto `python -m train launch`, progress, clear failures."""

from __future__ import annotations

import datetime
import json
import os

import luigi
import pytest

from contract import layout
from pipeline.train_task import Train
from tests.train.conftest import write_small_shard_set

DATE = datetime.date(2026, 1, 31)
SMALL = {
    "model": "mlp",
    "epochs": 2,
    "per_worker_batch_size": 16,
    "save_freq_steps": 5,
    "early_stopping_patience": 0,
    "reduce_lr_patience": 0,
}


@pytest.fixture
def output_root(tmp_path):
    """An output root whose run already holds a two-worker shard set (Preprocess complete)."""
    root = str(tmp_path / "runs")
    write_small_shard_set(layout.data_dir(root, DATE.isoformat()))
    return root


def test_command_maps_parameters(output_root):
    task = Train(date=DATE, output_root=output_root, num_workers=2, **SMALL)
    command = task.command()
    assert command[1:4] == ["-m", "train", "launch"]
    flags = dict(zip(command[4::2], command[5::2], strict=True))
    assert flags["--data-dir"] == layout.data_dir(output_root, "2026-01-31")
    assert flags["--train-dir"] == layout.train_dir(output_root, "2026-01-31")
    assert flags["--num-workers"] == "2" and flags["--model"] == "mlp"
    assert flags["--epochs"] == "2"


def test_progress_lines_reach_luigi(output_root, tmp_path):
    task = Train(date=DATE, output_root=output_root, **SMALL)
    seen: dict[str, object] = {}
    task.set_progress_percentage = lambda p: seen.update(percent=p)
    task.set_status_message = lambda m: seen.update(message=m)
    log = tmp_path / "train.log"
    progress = {"epoch": 3, "epochs": 4, "loss": 0.5, "val_accuracy": 0.875}
    log.write_text("noise\nPROGRESS " + json.dumps(progress) + "\n")
    task._report_progress(str(log), 0)
    assert seen["percent"] == 75
    assert seen["message"] == "epoch 3/4: loss 0.5000, val_accuracy 0.8750"


@pytest.mark.e2e
def test_luigi_train_runs_and_writes_history(output_root):
    task = Train(date=DATE, output_root=output_root, num_workers=2, **SMALL)
    assert luigi.build([task], local_scheduler=True, log_level="WARNING")
    with open(task.output().path) as f:
        doc = json.load(f)
    assert doc["epochs_completed"] == 2 and doc["num_workers"] == 2
    with open(os.path.join(layout.logs_dir(output_root, "2026-01-31"), "train.log")) as f:
        assert f.read().count("PROGRESS ") == 2


@pytest.mark.e2e
def test_worker_count_mismatch_fails_clearly(output_root):
    task = Train(date=DATE, output_root=output_root, num_workers=3, **SMALL)
    assert not luigi.build([task], local_scheduler=True, log_level="WARNING")
    assert not task.complete()
    with open(os.path.join(layout.logs_dir(output_root, "2026-01-31"), "train.log")) as f:
        assert "num_workers is 3 but the shard set" in f.read()
