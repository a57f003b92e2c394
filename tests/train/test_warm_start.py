"""Warm start: a run starts from the last blessed model, or cold (logged, recorded) and why.

The blessed model of the first tests is one real training run's model.keras with a latest
pointer naming it, as evaluate leaves them; the cold-start cases settle in this process.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess

import numpy as np
import pytest
import tf_keras as keras

from contract import atomic, layout, lineage, pointer
from contract.manifest import read_manifest
from contract.messages import parse_notice
from tests.train.conftest import history, train_env, write_small_shard_set
from tests.train.test_exact_resume import STEPS_PER_EPOCH, finished, outcome, train
from train import models, warm_start
from train.config import ConfigError, TrainConfig

BLESSED_DATE = "2026-01-01"
TONIGHT = "2026-01-02"
# Tiny enough that one step barely moves a weight: the run's weights stay the ones it started
# from, to within the rounding of the few steps of an epoch.
STILL = 1e-9


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("warm") / "data")
    write_small_shard_set(path)
    return path


@pytest.fixture(scope="module")
def solo_data_dir(tmp_path_factory) -> str:
    """A one-worker shard set for the runs that are about the starting model, not the
    cluster; the killed and resumed run keeps two workers, on `data_dir`."""
    path = str(tmp_path_factory.mktemp("warm") / "solo")
    write_small_shard_set(path, num_workers=1)
    return path


def bless(root: str, model_path: str, date: str = BLESSED_DATE, sha256: str | None = None):
    """Writes the latest pointer naming `model_path`, as evaluate does when it blesses."""
    pointer.write(
        root,
        {
            "date": date,
            "model_path": model_path,
            "model_sha256": sha256 or atomic.sha256_file(model_path),
            "accuracy": 0.5,
            "loss": 1.0,
            "dataset": "fashion_mnist",
            "metrics_path": layout.join(layout.evaluate_dir(root, date), layout.METRICS_FILE),
            "updated_utc": "2026-01-01T00:00:00+00:00",
        },
    )


@pytest.fixture(scope="module")
def first_night(solo_data_dir, tmp_path_factory) -> tuple[subprocess.CompletedProcess, str, str]:
    """A real one-worker first night (seed 5, 2 epochs) asked to warm start with nothing
    blessed yet, so it starts cold: (the launch, its output root, its train dir)."""
    root = str(tmp_path_factory.mktemp("blessed") / "runs")
    train_dir = layout.train_dir(root, BLESSED_DATE)
    proc = train(
        solo_data_dir,
        train_dir,
        num_workers=1,
        epochs=2,
        seed=5,
        early_stopping_patience=0,
        warm_start="last-blessed",
    )
    finished(proc)
    return proc, root, train_dir


@pytest.fixture(scope="module")
def blessed(first_night) -> str:
    """The first night's model.keras (each test blesses its own copy, see `night`)."""
    return os.path.join(first_night[2], layout.MODEL_FILE)


def night(tmp_path, blessed: str) -> tuple[str, str]:
    """A fresh output root holding a copy of the blessed night; (root, tonight's train dir)."""
    root = str(tmp_path / "runs")
    source_root = os.path.dirname(os.path.dirname(os.path.dirname(blessed)))
    shutil.copytree(source_root, root)
    bless(root, layout.join(layout.train_dir(root, BLESSED_DATE), layout.MODEL_FILE))
    return root, layout.train_dir(root, TONIGHT)


def trainable(model_path: str) -> list[np.ndarray]:
    model = keras.models.load_model(model_path, compile=False)
    return [w.numpy() for w in model.trainable_weights]


@pytest.mark.slow
def test_warm_start_begins_from_the_blessed_weights_and_records_them(
    solo_data_dir, tmp_path, blessed
):
    root, train_dir = night(tmp_path, blessed)
    model_path = layout.join(layout.train_dir(root, BLESSED_DATE), layout.MODEL_FILE)
    # warm_start_learning_rate sets the warm run's rate; the same run cold keeps its own.
    run = {
        "num_workers": 1,
        "epochs": 1,
        "seed": 11,
        "learning_rate": 0.02,
        "warm_start_learning_rate": STILL,
    }
    proc = train(solo_data_dir, train_dir, warm_start="last-blessed", **run)
    finished(proc)
    notices = [n for n in map(parse_notice, proc.stdout.splitlines()) if n is not None]
    assert f"warm start from the model blessed on {BLESSED_DATE} ({model_path})" in notices
    for got, want in zip(trainable(f"{train_dir}/model.keras"), trainable(model_path), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    sha256 = atomic.sha256_file(model_path)
    assert history(train_dir)["history"]["learning_rate"] == [pytest.approx(STILL)]
    assert history(train_dir)["warm_start"] == {
        "mode": "last-blessed",
        "started_from": {
            "model_path": model_path,
            "model_sha256": sha256,
            "run_date": BLESSED_DATE,
        },
        "cold_start_reason": "",
        "learning_rate": STILL,
        "finetune_epochs": 0,
        "finetune_learning_rate": 0.0,
    }
    with open(os.path.join(train_dir, layout.TRAIN_CONFIG_FILE)) as f:
        written = json.load(f)
    assert (written["warm_start_from"], written["warm_start_sha256"]) == (model_path, sha256)
    assert written["warm_start_date"] == BLESSED_DATE

    cold_dir = str(tmp_path / "cold" / "train")
    finished(train(solo_data_dir, cold_dir, **run))  # the same run, warm start off
    cold, blessed_weights = trainable(f"{cold_dir}/model.keras"), trainable(model_path)
    assert not all(np.allclose(c, b, atol=1e-3) for c, b in zip(cold, blessed_weights, strict=True))
    assert history(cold_dir)["warm_start"]["started_from"] is None
    assert history(cold_dir)["history"]["learning_rate"] == [pytest.approx(0.02)]
    assert history(cold_dir)["history"]["loss"][0] != history(train_dir)["history"]["loss"][0]


@pytest.mark.slow
def test_cold_start_is_logged_and_recorded_in_the_run(first_night):
    proc, root, train_dir = first_night
    reason = f"no blessed model yet ({os.path.join(root, 'latest.json')} is missing)"
    assert f"cold start: {reason}" in [parse_notice(line) for line in proc.stdout.splitlines()]
    doc = history(train_dir)["warm_start"]
    assert doc["started_from"] is None and doc["cold_start_reason"] == reason
    with open(os.path.join(train_dir, layout.TRAIN_CONFIG_FILE)) as f:
        assert json.load(f)["cold_start_reason"] == reason


def settled(data_dir: str, train_dir: str, caplog, **overrides) -> TrainConfig:
    config = TrainConfig(
        data_dir=data_dir, train_dir=train_dir, model="mlp", warm_start="last-blessed", **overrides
    )
    with caplog.at_level(logging.INFO, logger="train"):
        return warm_start.settle(config, read_manifest(data_dir))


def saved_model(path: str, name: str = "mlp", image_shape=(28, 28, 1), num_classes=10) -> str:
    keras.backend.clear_session()  # layer names as a fresh training process gives them
    os.makedirs(os.path.dirname(path), exist_ok=True)
    models.build(name, image_shape, num_classes).save(path)
    return path


def test_settle_names_a_fitting_blessed_model_and_its_sha256(data_dir, tmp_path, caplog):
    root = str(tmp_path / "runs")
    path = saved_model(layout.join(layout.train_dir(root, BLESSED_DATE), layout.MODEL_FILE))
    bless(root, path)
    config = settled(data_dir, layout.train_dir(root, TONIGHT), caplog)
    assert config.warm_start_from == path
    assert config.warm_start_sha256 == atomic.sha256_file(path)
    assert config.warm_start_date == BLESSED_DATE and config.cold_start_reason == ""
    assert f"warm start from {path}" in caplog.text


def test_settle_reads_the_run_the_task_names_not_the_train_dirs_place(data_dir, tmp_path, caplog):
    root = str(tmp_path / "runs")
    path = saved_model(layout.join(layout.train_dir(root, BLESSED_DATE), layout.MODEL_FILE))
    bless(root, path)
    elsewhere = str(tmp_path / "scratch" / "train")  # no run of the root lies there
    config = settled(data_dir, elsewhere, caplog, output_root=root, date=TONIGHT)
    assert config.warm_start_from == path and config.warm_start_date == BLESSED_DATE
    assert "no blessed model yet" in settled(data_dir, elsewhere, caplog).cold_start_reason
    # The run's own date is the one a retrain never starts from.
    config = settled(data_dir, elsewhere, caplog, output_root=root, date=BLESSED_DATE)
    assert config.warm_start_from == "" and config.cold_start_reason


def test_settle_starts_cold_from_a_model_of_another_dataset_lineage(data_dir, tmp_path, caplog):
    root = str(tmp_path / "runs")
    path = saved_model(layout.join(layout.train_dir(root, BLESSED_DATE), layout.MODEL_FILE))
    bless(root, path)  # same shapes: the weights alone would fit
    ours = lineage.identity(read_manifest(data_dir))
    doc = pointer.read(root) | {pointer.IDENTITY_KEY: ours}
    pointer.write(root, doc)
    assert settled(data_dir, layout.train_dir(root, TONIGHT), caplog).warm_start_from == path
    other = ours | {"class_names": ["sandal", *ours["class_names"][1:]]}
    pointer.write(root, doc | {pointer.IDENTITY_KEY: other})
    config = settled(data_dir, layout.train_dir(root, TONIGHT), caplog)
    assert config.warm_start_from == ""
    assert "is a model of another dataset lineage (class 0 named 'sandal'" in (
        config.cold_start_reason
    )


@pytest.mark.parametrize(
    "case, reason",
    [
        ("no-pointer", "no blessed model yet"),
        ("missing-file", f"the last blessed model {{path}} (run {BLESSED_DATE}) is missing"),
        ("wrong-sha256", "fails its sha256: "),
        ("other-architecture", "does not fit model 'mlp' on this shard set: "),
        ("other-input-shape", "does not fit model 'mlp' on this shard set: weight dense/kernel"),
        ("own-model", "the latest pointer names this run's own model"),
    ],
)
def test_settle_starts_cold_and_says_why(data_dir, tmp_path, caplog, case, reason):
    root = str(tmp_path / "runs")
    path = layout.join(layout.train_dir(root, BLESSED_DATE), layout.MODEL_FILE)
    if case == "other-architecture":
        saved_model(path, name="cnn")
    elif case == "other-input-shape":
        saved_model(path, image_shape=(32, 32, 1))
    elif case != "no-pointer":
        saved_model(path)
    if case == "own-model":
        path = layout.join(layout.train_dir(root, TONIGHT), layout.MODEL_FILE)
        saved_model(path)
    if case != "no-pointer":
        bless(root, path, sha256="0" * 64 if case == "wrong-sha256" else None)
    if case == "missing-file":
        os.remove(path)
    config = settled(data_dir, layout.train_dir(root, TONIGHT), caplog)
    assert config.warm_start_from == "" and config.warm_start_sha256 == ""
    assert reason.format(path=path) in config.cold_start_reason
    assert f"cold start: {config.cold_start_reason}" in caplog.text


def test_settle_keeps_the_starting_model_a_backup_was_made_with(data_dir, tmp_path, caplog):
    root = str(tmp_path / "runs")
    path = saved_model(layout.join(layout.train_dir(root, BLESSED_DATE), layout.MODEL_FILE))
    bless(root, path)
    train_dir = layout.train_dir(root, TONIGHT)
    first = settled(data_dir, train_dir, caplog)
    folder = os.path.join(train_dir, layout.BACKUP_DIR)
    os.makedirs(folder)
    atomic.write_json_atomic(os.path.join(folder, "settings.json"), dataclasses.asdict(first))
    atomic.write_json_atomic(os.path.join(folder, "state.json"), {})
    os.remove(os.path.join(root, layout.LATEST_POINTER_FILE))  # the pointer moved away since
    assert settled(data_dir, train_dir, caplog) == first


def test_a_worker_refuses_a_starting_model_that_changed(data_dir, tmp_path, caplog):
    root = str(tmp_path / "runs")
    path = saved_model(layout.join(layout.train_dir(root, BLESSED_DATE), layout.MODEL_FILE))
    bless(root, path)
    config = settled(data_dir, layout.train_dir(root, TONIGHT), caplog)
    saved_model(path, name="mlp", num_classes=3)  # replaced after the launcher settled it
    with pytest.raises(ConfigError, match="missing or changed since the launch chose it"):
        warm_start.load_into(models.build("mlp", (28, 28, 1), 10), config)


def test_an_unsettled_warm_start_is_refused_by_a_worker(data_dir, tmp_path):
    from train.worker import check_settings

    config = TrainConfig(data_dir=data_dir, train_dir=str(tmp_path), warm_start="last-blessed")
    with pytest.raises(ConfigError, match="settled by `python -m train launch`"):
        check_settings(config, read_manifest(data_dir), 2)


@pytest.mark.e2e
def test_warm_started_run_killed_mid_epoch_resumes_bit_identically(data_dir, tmp_path, blessed):
    root, reference_dir = night(tmp_path, blessed)
    resumed_dir = layout.train_dir(root, "2026-01-03")
    # A fine-tune epoch, then the cosine's: the kill falls after the restart.
    run = {
        "epochs": 1, "warm_start": "last-blessed", "warm_start_learning_rate": 0.005,
        "lr_schedule": "cosine", "warm_start_finetune_epochs": 1,
    }  # fmt: skip
    finished(train(data_dir, reference_dir, **run))
    fault = f"1:{STEPS_PER_EPOCH + 7}"  # inside the second epoch, past a backup
    proc = train(data_dir, resumed_dir, env=train_env(TRAIN_FAULT_KILL_AT_STEP=fault), **run)
    finished(proc)
    assert "worker 1 died" in proc.stdout and history(resumed_dir)["resumed_from_step"] > 0
    assert outcome(resumed_dir) == outcome(reference_dir)
    record = history(resumed_dir)["warm_start"]
    assert record["started_from"]["run_date"] == BLESSED_DATE
    assert record["finetune_epochs"] == 1 and record["finetune_learning_rate"] == 0.0005
    assert history(resumed_dir)["epochs_completed"] == 2


def test_a_model_by_import_path_warm_starts_from_its_blessed_self(data_dir, tmp_path):
    # The walk-through's model (a custom layer, hparams) is built, blessed, settled and loaded
    # as a warm start the way a worker does it; another width starts cold with the reason.
    model, hparams = "examples.my_model:build_model", {"width": 8}
    root = str(tmp_path / "runs")
    path = layout.join(layout.train_dir(root, BLESSED_DATE), layout.MODEL_FILE)
    os.makedirs(os.path.dirname(path))
    manifest = read_manifest(data_dir)
    make = TrainConfig(data_dir=data_dir, train_dir="", model=model, hparams=hparams)
    keras.backend.clear_session()
    blessed_model = models.build_for_run(make, manifest)
    blessed_model.save(path)
    bless(root, path)
    tonight = layout.train_dir(root, TONIGHT)
    config = warm_start.settle(
        dataclasses.replace(make, train_dir=tonight, warm_start="last-blessed"), manifest
    )
    assert config.warm_start_from == path and config.cold_start_reason == ""
    keras.backend.clear_session()
    fresh = models.build_for_run(config, manifest)
    assert not all(
        np.array_equal(a, b)
        for a, b in zip(fresh.get_weights(), blessed_model.get_weights(), strict=True)
    )
    warm_start.load_into(fresh, config)
    for a, b in zip(fresh.get_weights(), blessed_model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    wider = warm_start.settle(
        TrainConfig(
            data_dir=data_dir,
            train_dir=tonight,
            model=model,
            hparams={"width": 16},
            warm_start="last-blessed",
        ),
        manifest,
    )
    assert wider.warm_start_from == "" and "does not fit model" in wider.cold_start_reason


def _blessed_night(root: str, date: str, model_path: str) -> None:
    """The evaluate stage's files of a blessed, pushed night (the run history's view)."""
    folder = layout.evaluate_dir(root, date)
    os.makedirs(folder, exist_ok=True)
    model = {"path": model_path, "sha256": atomic.sha256_file(model_path)}
    metrics = {"model": model, "accuracy": 0.5, "loss": 1.0, "dataset": {"name": "fashion_mnist"}}
    atomic.write_json_atomic(os.path.join(folder, layout.METRICS_FILE), metrics)
    atomic.write_json_atomic(os.path.join(folder, layout.BLESSING_FILE), {"blessed": True})
    atomic.write_json_atomic(os.path.join(folder, layout.PUSH_FILE), {"pushed": True, "version": 1})


@pytest.mark.parametrize("pointer_date", [TONIGHT, "2026-01-05"])  # a retrain, a backfill
def test_settle_never_starts_from_the_runs_own_date_or_a_later_one(
    data_dir, tmp_path, caplog, pointer_date
):
    root = str(tmp_path / "runs")
    earlier = saved_model(layout.join(layout.train_dir(root, BLESSED_DATE), layout.MODEL_FILE))
    named = saved_model(layout.join(layout.train_dir(root, pointer_date), "blessed.keras"))
    bless(root, named, date=pointer_date)
    config = settled(data_dir, layout.train_dir(root, TONIGHT), caplog)
    assert config.warm_start_from == "" and f"names {pointer_date}, not a night before" in (
        config.cold_start_reason
    )
    _blessed_night(root, BLESSED_DATE, earlier)
    config = settled(data_dir, layout.train_dir(root, TONIGHT), caplog)
    assert config.warm_start_from == earlier and config.warm_start_date == BLESSED_DATE
    # A night rolled back past is not returned to.
    marker = os.path.join(layout.evaluate_dir(root, BLESSED_DATE), "rolled_back.json")
    atomic.write_json_atomic(marker, {"to": "2025-12-31"})
    assert settled(data_dir, layout.train_dir(root, TONIGHT), caplog).warm_start_from == ""


def test_an_unreadable_pointer_starts_cold_with_the_reason(data_dir, tmp_path, caplog):
    root = str(tmp_path / "runs")
    os.makedirs(root)
    with open(os.path.join(root, layout.LATEST_POINTER_FILE), "w") as f:
        f.write('{"date": "2026-01-01", "model_pa')  # a truncated write by hand
    config = settled(data_dir, layout.train_dir(root, TONIGHT), caplog)
    assert config.warm_start_from == ""
    assert "is unreadable (not JSON" in config.cold_start_reason
    assert "python -m pipeline rollback --to DATE" in config.cold_start_reason
