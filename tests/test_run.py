"""The run value: what every stage of a night shares, checked where it is made, its paths."""

from __future__ import annotations

import datetime

import pytest

from contract import layout
from contract.run import Run
from contract.settings import SettingsError
from pipeline import DataGate, Evaluate, Preprocess, Train

DAY = datetime.date(2026, 1, 31)


def test_a_run_gives_every_folder_and_the_settings_a_stage_takes_from_it():
    run = Run("gs://b/runs", DAY, "fashion_mnist", 2)
    assert run.data_dir == "gs://b/runs/2026-01-31/data"
    assert run.manifest_path == layout.join(run.data_dir, layout.MANIFEST_FILE)
    assert run.history_path == "gs://b/runs/2026-01-31/train/history.json"
    assert run.metrics_path == "gs://b/runs/2026-01-31/evaluate/metrics.json"
    assert run.settings_for(("output_root", "date", "num_workers")) == {
        "output_root": "gs://b/runs",
        "date": "2026-01-31",
        "num_workers": 2,
    }
    assert run.settings_for(("data_dir", "train_dir")) == {
        "data_dir": "gs://b/runs/2026-01-31/data",
        "train_dir": "gs://b/runs/2026-01-31/train",
    }


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("s3://b/runs", "2026-01-31", "d", 2), "s3://"),
        (("runs", "2026-02-30", "d", 2), "calendar date"),
        (("runs", "2026-01-31", "d", 0), "num_workers must be at least 1"),
        (("runs", "2026-01-31", " ", 2), "dataset is empty"),
    ],
)
def test_a_run_is_checked_once_where_it_is_made(args, named):
    with pytest.raises(SettingsError, match=named):
        Run.of(*args)


@pytest.mark.parametrize("task", [Preprocess, DataGate, Train, Evaluate])
def test_every_stage_task_writes_its_config_with_the_runs_values(task, tmp_path):
    made = task(date=DAY, output_root=str(tmp_path), dataset="fashion_mnist", num_workers=3)
    config = made.stage_config
    assert made.stage_config is config  # built and checked once
    for name, value in made.run_value.settings_for(made.spec.run_settings).items():
        assert getattr(config, name) == value
        assert f"--{name.replace('_', '-')}" in made.command()
    assert made.output().path == made.spec.output(made.run_value)
