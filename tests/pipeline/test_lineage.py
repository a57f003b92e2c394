"""One output root, one model lineage: a night of another dataset is refused before any work."""

from __future__ import annotations

import datetime

import pytest

from contract import lineage
from contract.settings import SettingsError
from pipeline import DataGate, FullRun
from pipeline.params import BadParameterExit
from tests.preprocess.test_data_gate import THRESHOLDS, write_night

DAY = datetime.date(2026, 1, 2)


def test_the_first_kept_schema_records_the_lineage_and_a_reset_starts_a_new_one(tmp_path):
    from preprocess import data_gate

    write_night(tmp_path, "2026-01-01")
    data_gate.run_gate(data_gate.DataGateConfig(str(tmp_path), "2026-01-01", **THRESHOLDS))
    first = lineage.read(str(tmp_path))
    assert first["dataset"] == "test" and first["since"] == "2026-01-01"
    assert first["reason"] == "first night" and first["replaces"] is None
    write_night(tmp_path, "2026-01-02")
    config = data_gate.DataGateConfig(str(tmp_path), "2026-01-02", reset_schema=True, **THRESHOLDS)
    data_gate.run_gate(config)
    again = lineage.read(str(tmp_path))
    assert again["reason"] == "reset_schema" and again["replaces"]["since"] == "2026-01-01"


def test_a_night_of_another_dataset_is_refused_naming_both_ways_out(tmp_path, capsys):
    root = str(tmp_path / "runs")
    write_night(tmp_path / "runs", "2026-01-01")
    from preprocess import data_gate

    data_gate.run_gate(data_gate.DataGateConfig(root, "2026-01-01", **THRESHOLDS))
    DataGate(date=DAY, output_root=root, dataset="test").check_parameters()
    with pytest.raises(SettingsError) as refused:
        DataGate(date=DAY, output_root=root, dataset="fashion_mnist").check_parameters()
    said = str(refused.value)
    assert "holds the model lineage of dataset 'test'" in said and "'fashion_mnist'" in said
    assert "--output-root" in said and "--DataGate-reset-schema" in said
    DataGate(
        date=DAY, output_root=root, dataset="fashion_mnist", reset_schema=True
    ).check_parameters()
    # FullRun refuses it while luigi decides what to run: one line, exit 2, nothing scheduled.
    with pytest.raises(BadParameterExit):
        FullRun(date=DAY, output_root=root, dataset="fashion_mnist").complete()
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: DataGate: ")
