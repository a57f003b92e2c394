"""A model by import path resumes exactly: its dropout, its optimizer hook's state and its custom
layer come back from the backup as the built-in models' do."""

from __future__ import annotations

import pytest

from tests.train.conftest import history, train_env, write_small_shard_set
from tests.train.test_exact_resume import STEPS_PER_EPOCH, finished, outcome, train

pytestmark = pytest.mark.e2e

EXAMPLE = {
    "model": "examples.my_model:build_model",
    "hparams": '{"width": 4, "dropout": 0.3}',
    "epochs": 2,
    "early_stopping_patience": 0,
}


def test_the_example_model_resumes_exactly_after_a_killed_worker(tmp_path):
    data_dir = str(tmp_path / "data")
    write_small_shard_set(data_dir)
    reference_dir, resumed_dir = str(tmp_path / "reference"), str(tmp_path / "resumed")
    finished(train(data_dir, reference_dir, **EXAMPLE))
    assert history(reference_dir)["model"] == EXAMPLE["model"]
    fault = f"1:{STEPS_PER_EPOCH + 5}"  # inside the second epoch, past a backup
    proc = train(data_dir, resumed_dir, env=train_env(TRAIN_FAULT_KILL_AT_STEP=fault), **EXAMPLE)
    finished(proc)
    assert "worker 1 died" in proc.stdout and history(resumed_dir)["resumed_from_step"] > 0
    assert outcome(resumed_dir) == outcome(reference_dir)
