"""The Evaluate and FullRun tasks: parameters map onto the stage's command line and the DAG."""

from __future__ import annotations

import datetime

import luigi
import pytest

from evaluate.__main__ import parse_args
from pipeline import Evaluate, FullRun, Train, supersede

DATE = datetime.date(2026, 1, 31)
SHARED = {"date": DATE, "output_root": "/runs", "dataset": "fashion_mnist", "num_workers": 2}


@pytest.mark.parametrize(
    ("thresholds", "expected"),
    [
        ({"min_accuracy": 0.85, "max_regression": 0.01}, (0.85, 0.01)),
        ({"min_accuracy": None, "max_regression": None}, (None, None)),
    ],
)
def test_evaluate_command_round_trips_into_the_stage_config(thresholds, expected):
    task = Evaluate(**SHARED, batch_size=250, **thresholds)
    command = task.command()
    assert command[1:3] == ["-m", "evaluate"]
    config = parse_args(command[3:])
    assert (config.output_root, config.date, config.dataset) == (
        "/runs",
        "2026-01-31",
        "fashion_mnist",
    )
    assert config.batch_size == 250
    assert (config.min_accuracy, config.max_regression) == expected


def test_evaluate_requires_train_of_the_same_run_and_ends_with_metrics():
    task = Evaluate(**SHARED)
    assert task.requires() == Train(**SHARED)
    assert task.output().path == "/runs/2026-01-31/evaluate/metrics.json"


def test_full_run_requires_evaluate_of_the_same_run():
    run = FullRun(**SHARED)
    assert isinstance(run, luigi.WrapperTask)
    assert run.requires() == Evaluate(**SHARED)


def test_force_stage_accepts_only_stage_names():
    assert FullRun(**SHARED, force_stage="train").force_stage == "train"
    with pytest.raises(ValueError, match="trian"):
        FullRun(**SHARED, force_stage="trian")
    assert supersede.STAGES == ("preprocess", "train", "evaluate")


@pytest.mark.parametrize("task", [Evaluate, FullRun])
def test_every_parameter_is_described(task):
    for name, parameter in task.get_params():
        assert parameter.description, f"{task.__name__}.{name} has no description"
