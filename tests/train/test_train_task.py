"""The Luigi Train task: parameters onto `python -m train launch`, progress, clear failures."""

from __future__ import annotations

import datetime
import json
import os

import luigi
import pytest

from contract import layout
from contract.messages import PROGRESS_PREFIX
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
    """An output root whose run already holds a one-worker shard set (Preprocess complete).

    One worker: what is under test is the task around the launch, not the cluster.
    """
    root = str(tmp_path / "runs")
    write_small_shard_set(layout.data_dir(root, DATE.isoformat()), num_workers=1)
    return root


def test_command_maps_parameters(output_root):
    warm = {"warm_start": "last-blessed", "warm_start_learning_rate": 0.001}
    task = Train(date=DATE, output_root=output_root, num_workers=2, **warm, **SMALL)
    command = task.command()
    assert command[1:4] == ["-m", "train", "launch"]
    flags = dict(zip(command[4::2], command[5::2], strict=True))
    assert flags["--data-dir"] == layout.data_dir(output_root, "2026-01-31")
    assert flags["--train-dir"] == layout.train_dir(output_root, "2026-01-31")
    assert flags["--num-workers"] == "2" and flags["--model"] == "mlp"
    assert flags["--epochs"] == "2"
    assert (
        flags["--warm-start"] == "last-blessed" and flags["--warm-start-learning-rate"] == "0.001"
    )


def test_local_executor_runs_workers_as_local_processes(output_root):
    command = Train(date=DATE, output_root=output_root, **SMALL).command()
    assert "--backend" not in command


@pytest.fixture
def docker_executor_cfg():
    """luigi.cfg's [Executor] kind = docker with a [Docker] image and mounts, for one test."""
    cfg = luigi.configuration.get_config()
    values = {
        ("Executor", "kind"): "docker",
        ("Docker", "image"): "img:1",
        ("Docker", "mounts"): '["runs", ".cache:ro"]',
    }
    saved = {key: cfg.get(*key, None) for key in values}
    for (section, name), value in values.items():
        cfg.set(section, name, value)
    yield
    for (section, name), value in saved.items():
        if value is None:
            cfg.remove_option(section, name)
        else:
            cfg.set(section, name, value)


def test_docker_executor_adds_the_launchers_docker_backend(output_root, docker_executor_cfg):
    command = Train(date=DATE, output_root=output_root, **SMALL).command()
    assert command[1:4] == ["-m", "train", "launch"]  # the launcher still runs here
    tail = command[command.index("--backend") :]
    assert tail == [
        "--backend", "docker", "--image", "img:1", "--docker-mount", "runs",
        "--docker-mount", ".cache:ro", "--worker-port", "2222",
    ]  # fmt: skip


@pytest.mark.e2e
def test_luigi_train_runs_and_writes_history(output_root):
    task = Train(date=DATE, output_root=output_root, num_workers=1, **SMALL)
    assert luigi.build([task], local_scheduler=True, log_level="WARNING")
    with open(task.output().path) as f:
        doc = json.load(f)
    assert doc["epochs_completed"] == 2 and doc["num_workers"] == 1
    with open(os.path.join(layout.logs_dir(output_root, "2026-01-31"), "train.log")) as f:
        assert f.read().count(PROGRESS_PREFIX) == 2


@pytest.mark.e2e
def test_worker_count_mismatch_fails_clearly(output_root):
    task = Train(date=DATE, output_root=output_root, num_workers=3, **SMALL)
    assert not luigi.build([task], local_scheduler=True, log_level="WARNING")
    assert not task.complete()
    with open(os.path.join(layout.logs_dir(output_root, "2026-01-31"), "train.log")) as f:
        assert "num_workers is 3 but the shard set" in f.read()
