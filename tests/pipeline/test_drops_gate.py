"""The DataGate task: where it sits in the DAG, the command it runs, its settings in luigi.cfg."""

from __future__ import annotations

import configparser
import datetime
import sys

import pytest

from pipeline import DataGate, Preprocess, Train
from pipeline.data_gate_task import verdict_line
from preprocess import data_gate
from preprocess.data_gate import DataGateConfig
from tests.factories import PROJECT_ROOT

SHARED = {
    "date": datetime.date(2026, 1, 2),
    "output_root": "runs",
    "dataset": "fashion_mnist",
    "num_workers": 2,
}


def test_the_gate_sits_between_preprocess_and_train():
    assert Train(**SHARED).requires() == DataGate(**SHARED)
    assert DataGate(**SHARED).requires() == Preprocess(**SHARED)
    assert DataGate(**SHARED).output().path == "runs/2026-01-02/data/data_gate.json"


def test_command_maps_the_thresholds_and_the_override():
    task = DataGate(**SHARED, label_drift_threshold=0.25, pixel_mean_shift_threshold=0.5)
    command = task.command()
    assert command[:3] == [sys.executable, "-m", "preprocess.data_gate"]
    assert data_gate.parse_args(command[3:]) == DataGateConfig(
        "runs", "2026-01-02", label_drift_threshold=0.25, pixel_mean_shift_threshold=0.5
    )
    accepting = DataGate(**SHARED, accept_anomalies=True, pixel_stddev_shift_threshold=0.3)
    assert data_gate.parse_args(accepting.command()[3:]) == DataGateConfig(
        "runs", "2026-01-02", pixel_stddev_shift_threshold=0.3, accept_anomalies=True
    )


def test_a_threshold_out_of_range_is_refused_while_luigi_schedules():
    DataGate(**SHARED).check_parameters()
    for value in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"label_drift_threshold must be .*, got {value}"):
            DataGate(**SHARED, label_drift_threshold=value).check_parameters()


def test_luigi_cfg_never_holds_the_override():
    # Thresholds are set there only where they differ from the defaults.
    cfg = configparser.ConfigParser()
    cfg.read(PROJECT_ROOT / "luigi.cfg")
    assert "accept_anomalies" not in cfg["DataGate"]


def test_verdict_line_names_the_baseline_and_the_measures():
    verdict = {
        "status": "passed", "baseline_date": "2026-01-01", "anomalies": 0,
        "measures": {"label_linf": 0.0123, "pixel_mean_shift": 0.004},
        "schema": {"inferred_now": False},
    }  # fmt: skip
    assert verdict_line(verdict) == (
        "passed against 2026-01-01 (label_linf 0.0123, pixel_mean_shift 0.0040)"
    )
    first = {**verdict, "baseline_date": None, "measures": {}, "schema": {"inferred_now": True}}
    assert verdict_line(first) == "passed on its first night (schema inferred)"
    assert verdict_line({**verdict, "status": "accepted", "anomalies": 1}).endswith(
        ", 1 anomalies accepted"
    )


def test_command_maps_the_window_and_the_schema_reset():
    task = DataGate(**SHARED, min_window_days=3, reset_schema=True)
    assert data_gate.parse_args(task.command()[3:]) == DataGateConfig(
        "runs", "2026-01-02", min_window_days=3, reset_schema=True
    )
    assert data_gate.parse_args(DataGate(**SHARED).command()[3:]).min_window_days is None
    with pytest.raises(ValueError, match="min_window_days must be at least 1 .*, got 0"):
        DataGate(**SHARED, min_window_days=0).check_parameters()


def test_luigi_cfg_never_holds_the_schema_reset():
    cfg = configparser.ConfigParser()
    cfg.read(PROJECT_ROOT / "luigi.cfg")
    assert "reset_schema" not in cfg["DataGate"]


def test_verdict_line_names_a_schema_reset_and_a_schema_not_kept():
    verdict = {
        "status": "passed", "baseline_date": "2026-01-01", "anomalies": 0, "reset_schema": True,
        "measures": {"label_linf": 0.0123, "eval_label_linf": 0.0},
        "schema": {"inferred_now": True, "kept_now": True},
    }  # fmt: skip
    assert verdict_line(verdict) == (
        "passed against 2026-01-01 (label_linf 0.0123, eval_label_linf 0.0000), schema "
        "inferred again (--DataGate-reset-schema)"
    )
    first = {
        **verdict, "status": "accepted", "anomalies": 1, "baseline_date": None,
        "reset_schema": False, "schema": {"inferred_now": True, "kept_now": False},
    }  # fmt: skip
    assert verdict_line(first) == (
        "accepted on its first night (schema not kept: the night did not pass), "
        "1 anomalies accepted"
    )
