"""The nightly recipe's kind resumes exactly after a killed worker: in float32 on a model by
import path, whose dropout, optimizer hook's state and custom layer come back from the backup as
the built-in models' do, and in bfloat16 on the nightly cnn3.

Beside test_exact_resume.py (whose settings and helpers it shares) so that `make test` can
run it on one process while the other runs that file.
"""

from __future__ import annotations

import pytest

from tests.recipe import nightly
from tests.train.conftest import SMALL_RUN, history, train_env, write_small_shard_set
from tests.train.test_exact_resume import EXACT_RUN, STEPS_PER_EPOCH, finished, outcome, train

# The nightly recipe's kind (luigi.cfg [Train]) in 2 epochs: on-the-fly augmentation, a
# warmed-up cosine schedule and label smoothing, all of whose state a resume must put back.
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
# The example model module (docs/extending.md) brings its own loss, which label smoothing
# cannot change (such a pair is refused): the rest of the recipe applies to it.
EXAMPLE = {
    "model": "examples.my_model:build_model",
    "hparams": '{"width": 4, "dropout": 0.3}',
    "precision": "float32",
    "label_smoothing": 0.0,
}
# (settings, steps an epoch). cnn3 in bfloat16 is the slowest step here on a CPU without
# bfloat16 arithmetic, where each step is emulated: its case reads half the examples.
CASES = {
    "example-model": ({**RECIPE, **EXAMPLE}, STEPS_PER_EPOCH),
    "cnn3-bf16": (
        {**RECIPE, "model": "cnn3", "precision": "mixed_bfloat16"},
        STEPS_PER_EPOCH // 2,
    ),
}


@pytest.mark.e2e
@pytest.mark.parametrize("case", list(CASES))
def test_recipe_resumes_exactly_after_a_killed_worker(tmp_path, case):
    recipe, steps = CASES[case]
    data_dir = str(tmp_path / "data")
    write_small_shard_set(data_dir, per_worker=steps * SMALL_RUN["per_worker_batch_size"])
    reference_dir, resumed_dir = str(tmp_path / "reference"), str(tmp_path / "resumed")
    finished(train(data_dir, reference_dir, **recipe))
    reference = history(reference_dir)
    assert (reference["precision"], reference["model"]) == (recipe["precision"], recipe["model"])
    assert reference["steps_per_epoch"] == steps
    fault = f"1:{steps + steps // 2 + 1}"  # inside the second epoch, past a backup
    proc = train(data_dir, resumed_dir, env=train_env(TRAIN_FAULT_KILL_AT_STEP=fault), **recipe)
    finished(proc)
    assert "worker 1 died" in proc.stdout and history(resumed_dir)["resumed_from_step"] > 0
    assert outcome(resumed_dir) == outcome(reference_dir)
    rates = reference["history"]["learning_rate"]
    # Each epoch records its last step's rate: epoch 1's is one warm-up step short of the
    # peak, then the cosine decays it to nothing at the last step.
    peak = EXACT_RUN["learning_rate"]
    assert rates[0] == pytest.approx(peak * (steps - 1) / steps)
    assert 0 <= rates[1] < rates[0] / 10
