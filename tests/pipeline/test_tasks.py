"""The Evaluate and FullRun tasks: parameters map onto the stage's command line and the DAG."""

from __future__ import annotations

import datetime
import json
import logging
import os
import subprocess
import sys
import traceback

import luigi
import pytest

from contract import ledger, run_lock, settings
from evaluate.__main__ import parse_args
from pipeline import Evaluate, FullRun, Preprocess, Train, full_run, supersede
from tests.factories import PROJECT_ROOT

DATE = datetime.date(2026, 1, 31)
RETCODE_SCHEDULING_ERROR = 35  # luigi.cfg [retcode]
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


def write_manifest(root, **parameters) -> None:
    """A shard set's manifest as preprocess records it (only what FullRun compares)."""
    data_dir = root / "2026-01-31" / "data"
    data_dir.mkdir(parents=True)
    recorded = {"dataset": "fashion_mnist", "num_workers": 2, "validation_fraction": 0.1}
    recorded |= {"seed": "0", **parameters}
    doc = {"parameters": recorded, "num_workers": recorded["num_workers"]}
    (data_dir / "manifest.json").write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("recorded", "named"),
    [
        ({"validation_fraction": 0.2}, "validation_fraction 0.2 (now 0.1)"),
        ({"seed": "7"}, "seed '7' (now 0)"),
        ({"num_workers": 3}, "num_workers 3 (now 2)"),
        ({"dataset": "mnist"}, "dataset 'mnist' (now 'fashion_mnist')"),
        ({"train_split": "train[:50%]"}, "train_split 'train[:50%]' (now 'train')"),
        ({"eval_split": "validation"}, "eval_split 'validation' (now 'test')"),
    ],
)
def test_full_run_refuses_a_shard_set_made_with_other_parameters(tmp_path, recorded, named):
    write_manifest(tmp_path, **recorded)
    run = FullRun(**(SHARED | {"output_root": str(tmp_path)}))
    with pytest.raises(
        full_run.ShardSetMismatch, match="made with other Preprocess parameters"
    ) as e:
        run.complete()
    assert named in str(e.value) and "--force-stage preprocess" in str(e.value)
    assert not (tmp_path / "2026-01-31" / run_lock.LOCK_FILE).exists()


def test_full_run_accepts_its_own_shard_set(tmp_path):
    write_manifest(tmp_path)
    run = FullRun(**(SHARED | {"output_root": str(tmp_path)}))
    full_run.check_shard_set_parameters(Preprocess(**run.shared_params()))


@pytest.mark.slow
def test_mismatch_refusal_through_the_command_line(tmp_path):
    write_manifest(tmp_path, validation_fraction=0.25)
    result = subprocess.run(
        [sys.executable, "-m", "luigi", "--module", "pipeline", "FullRun", "--local-scheduler"]
        + ["--date=2026-01-31", f"--output-root={tmp_path}"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env=os.environ | {"TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout=300,
    )
    assert result.returncode == RETCODE_SCHEDULING_ERROR
    # One line of the pipeline's, then luigi's summary: no traceback of the refusal.
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "validation_fraction 0.25 (now 0.1)" in errors[0], errors
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "2026-01-31" / "train").exists()


def _complete_error(exception: Exception) -> logging.LogRecord:
    """The warning luigi's worker logs when a task's complete() raised `exception`."""
    try:
        raise exception
    except Exception:
        trace = traceback.format_exc()
    message = (
        f"Will not run Train(...) or any dependencies due to error in complete() method:\n{trace}"
    )
    return logging.LogRecord("luigi-interface", logging.WARNING, __file__, 1, message, None, None)


def test_only_a_refusals_complete_error_is_kept_from_the_log():
    refusal = full_run.RefusalTraceback()
    assert not refusal.filter(_complete_error(full_run.TrainSettingsMismatch("other epochs")))
    assert not refusal.filter(_complete_error(run_lock.RunLockedError("locked by pid 1")))
    # A bug in complete() keeps its traceback, and luigi's other warnings pass.
    assert refusal.filter(_complete_error(KeyError("manifest")))
    other = logging.LogRecord("luigi-interface", logging.WARNING, __file__, 1, "x", None, None)
    assert refusal.filter(other)


@pytest.mark.parametrize(
    ("task", "flag", "value", "named"),
    [
        ("FullRun", "--Evaluate-min-accuracy", "93", "min_accuracy is a fraction in [0, 1]"),
        ("FullRun", "--Train-seed", "-1", "seed must be 0 or more"),
        ("FullRun", "--Train-reduce-lr-patience", "-1", "reduce_lr_patience must be 0 (off)"),
        ("Train", "--learning-rate", "inf", "learning_rate must be a finite number, got inf"),
        ("Evaluate", "--max-regression", "nan", "max_regression is a fraction in [0, 1]"),
        ("FullRun", "--Preprocess-validation-fraction", "nan", "validation_fraction must be in"),
        ("Preprocess", "--num-workers", "0", "num_workers must be at least 1, got 0"),
        ("DataGate", "--label-drift-threshold", "-1", "label_drift_threshold must be a finite"),
        ("FullRun", "--DataGate-pixel-mean-shift-threshold", "nan", "pixel_mean_shift_threshold"),
    ],
)
def test_bad_parameters_are_refused_before_any_stage_runs(tmp_path, task, flag, value, named):
    """Checked while luigi schedules: an evaluation threshold is not found wrong after the
    preprocess and train stages ran."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            task,
            "--local-scheduler",
            "--date=2026-01-31",
            f"--output-root={tmp_path / 'runs'}",
            flag,
            value,
        ],  # fmt: skip
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env=os.environ | {"TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout=300,
    )
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(errors) == 1 and named in errors[0] and value in errors[0], errors
    assert "Traceback" not in result.stderr + result.stdout
    # Nothing ran: the only file is the ledger's record of the refusal.
    assert os.listdir(tmp_path / "runs") == [ledger.LEDGER_FILE]
    (record,) = ledger.read(str(tmp_path / "runs"))
    assert (record["entry_point"], record["outcome"]) == (task, ledger.REFUSED)
    assert named in record["reason"] and errors[0].endswith(record["reason"])


def write_finished_training(root, task_hparams=None, **changed) -> Train:
    """A finished train folder whose config.json records Train's own settings, with `changed`."""
    train = Train(**(SHARED | {"output_root": str(root), "hparams": task_hparams or {}}))
    train_dir = root / "2026-01-31" / "train"
    train_dir.mkdir(parents=True)
    recorded = {
        name: settings.plain(value) for name, value in train.param_kwargs.items() if name != "date"
    }
    recorded |= {"precision": "float32", **changed}
    (train_dir / "config.json").write_text(json.dumps(recorded))
    (train_dir / "history.json").write_text(json.dumps({"history": {}}))
    return train


def test_full_run_refuses_a_date_trained_with_other_train_parameters(tmp_path, capsys):
    write_manifest(tmp_path)
    train = write_finished_training(tmp_path, epochs=3, seed=7, save_freq_steps=1)
    run = FullRun(**(SHARED | {"output_root": str(tmp_path)}))
    with pytest.raises(full_run.TrainSettingsMismatch) as e:
        run.complete()
    message = str(e.value)
    assert "2026-01-31 is complete with other Train settings" in message
    assert f"epochs 3 (now {train.epochs})" in message and f"seed 7 (now {train.seed})" in message
    assert "save_freq_steps" not in message  # how often it saved does not change the model
    assert "--force-stage train" in message
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "epochs 3" in errors[0]
    assert not (tmp_path / "2026-01-31" / run_lock.LOCK_FILE).exists()


def test_full_run_accepts_its_own_training(tmp_path):
    write_manifest(tmp_path)
    train = write_finished_training(tmp_path, save_freq_steps=1)
    full_run.check_train_settings(train)


def test_hparams_compare_as_objects(tmp_path):
    recorded = {"width": 64, "depth": 2}
    train = write_finished_training(tmp_path, {"depth": 2, "width": 64}, hparams=recorded)
    train.check_parameters()  # a DictParameter's frozen mapping is a JSON object to the stage
    full_run.check_train_settings(train)  # the same object, its keys in another order
    other = Train(**(SHARED | {"output_root": str(tmp_path), "hparams": {"depth": 2}}))
    with pytest.raises(full_run.TrainSettingsMismatch, match="hparams"):
        full_run.check_train_settings(other)
