"""The nightly recipe's kind resumes exactly after a killed worker, in float32 and bfloat16.

Beside test_exact_resume.py (whose settings and helpers it shares) so that `make test` can
run it on one process while the other runs that file.
"""

from __future__ import annotations

import pytest

from tests.recipe import nightly
from tests.train.conftest import history, train_env, write_small_shard_set
from tests.train.test_exact_resume import EXACT_RUN, STEPS_PER_EPOCH, finished, outcome, train

# The nightly recipe's kind (luigi.cfg [Train]) in 2 epochs: on-the-fly augmentation, a
# warmed-up cosine schedule and label smoothing, all of whose state a resume must put back;
# with the mlp in float32 (the recipe's state, not a model's, is under test there) and with
# the nightly cnn3 computing in bfloat16. Every model's training step is in test_units.py.
RECIPE = {
    **nightly(
        "Train",
        "augment",
        "lr_schedule",
        "warmup_epochs",
        "label_smoothing",
        "early_stopping_patience",
    ),
    "epochs": 2,
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("recipe") / "data")
    write_small_shard_set(path)
    return path


@pytest.mark.e2e
@pytest.mark.parametrize(
    "model, precision", [("mlp", "float32"), ("cnn3", "mixed_bfloat16")], ids=["mlp", "cnn3-bf16"]
)
def test_recipe_resumes_exactly_after_a_killed_worker(data_dir, tmp_path, model, precision):
    recipe = {**RECIPE, "model": model, "precision": precision}
    reference_dir, resumed_dir = str(tmp_path / "reference"), str(tmp_path / "resumed")
    finished(train(data_dir, reference_dir, **recipe))
    assert history(reference_dir)["precision"] == precision
    fault = f"1:{STEPS_PER_EPOCH + 9}"  # inside the second epoch, past a backup
    proc = train(data_dir, resumed_dir, env=train_env(TRAIN_FAULT_KILL_AT_STEP=fault), **recipe)
    finished(proc)
    assert "worker 1 died" in proc.stdout and history(resumed_dir)["resumed_from_step"] > 0
    assert outcome(resumed_dir) == outcome(reference_dir)
    rates = history(reference_dir)["history"]["learning_rate"]
    # Each epoch records its last step's rate: epoch 1's is one warm-up step short of the
    # peak, then the cosine decays it to nothing at the last step.
    peak = EXACT_RUN["learning_rate"]
    assert rates[0] == pytest.approx(peak * (STEPS_PER_EPOCH - 1) / STEPS_PER_EPOCH)
    assert 0 <= rates[1] < rates[0] / 10
