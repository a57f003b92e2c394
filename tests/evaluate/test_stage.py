"""The evaluate stage end to end on a tiny trained run: numbers, files, errors."""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest
import tf_keras

from contract import atomic, layout
from evaluate import EvaluateConfig, data, run, stage
from evaluate.report import (
    CONFUSION_MATRIX_PNG,
    RELIABILITY_PNG,
    REPORT_FILE,
    TRAINING_CURVES_PNG,
)
from tests import factories
from tests.evaluate import trained_run
from tests.evaluate.conftest import DATE

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.usefixtures("quick_pictures")  # the pictures are test_writes_every_file's
@pytest.mark.parametrize("batch_size", [128, 1000])  # a ragged last batch, and one batch
def test_matches_model_evaluate(make_config, batch_size):
    config = make_config(batch_size=batch_size)
    metrics = run(config)

    doc = atomic.read_json(os.path.join(config.data_dir, layout.MANIFEST_FILE))
    images, labels = trained_run.read_split(config.data_dir, doc, layout.EVAL_SPLIT)
    model = tf_keras.models.load_model(config.model_path)
    loss, accuracy = model.evaluate(images, labels, batch_size=64, verbose=0)

    assert metrics["num_examples"] == 300
    assert metrics["accuracy"] == pytest.approx(accuracy, abs=1e-5)
    assert metrics["loss"] == pytest.approx(loss, rel=1e-4)
    # Not trivially equal: the tiny model is far from perfect and far from chance.
    assert 0.3 < metrics["accuracy"] < 1.0


def test_writes_every_file_and_metrics_last(make_config, monkeypatch):
    config = make_config()
    written_paths: list[str] = []
    write = atomic.write_bytes_atomic

    def recording_write(path: str, data: bytes) -> None:
        write(path, data)
        written_paths.append(path)

    monkeypatch.setattr(atomic, "write_bytes_atomic", recording_write)
    metrics = run(config)
    out = config.evaluate_dir
    for name in (CONFUSION_MATRIX_PNG, TRAINING_CURVES_PNG, RELIABILITY_PNG):
        with open(os.path.join(out, name), "rb") as f:
            assert f.read(8) == PNG_MAGIC
    written = atomic.read_json(os.path.join(out, layout.METRICS_FILE))
    assert written == json.loads(json.dumps(metrics))
    # The order of the writes, not file times: metrics.json is the stage's completion marker.
    in_out = [os.path.basename(p) for p in written_paths if os.path.dirname(p) == out]
    assert in_out[-1] == layout.METRICS_FILE
    assert sorted(set(in_out)) == sorted(os.listdir(out))  # no file bypassed the atomic writes
    assert not [name for name in os.listdir(out) if ".tmp-" in name]

    assert list(metrics["per_class"]) == factories.CLASS_NAMES
    matrix = np.array(metrics["confusion_matrix"]["matrix"])
    assert matrix.shape == (10, 10) and matrix.sum() == 300
    assert np.trace(matrix) == round(metrics["accuracy"] * 300)
    supports = [c["support"] for c in metrics["per_class"].values()]
    assert supports == matrix.sum(axis=1).tolist()
    macro_f1 = np.mean([c["f1"] for c in metrics["per_class"].values()])
    assert metrics["macro_avg"]["f1"] == pytest.approx(macro_f1)

    # Relative to output_root, so a moved runs folder still reads.
    assert metrics["model"]["path"] == f"{config.date}/train/{layout.MODEL_FILE}"
    resolved = os.path.join(config.output_root, metrics["model"]["path"])
    assert os.path.samefile(resolved, config.model_path)
    assert len(metrics["model"]["sha256"]) == 64
    assert metrics["model"]["training"]["epochs_completed"] == 2
    assert metrics["dataset"] == {
        "name": "fashion_mnist",
        "version": "3.0.1",
        "split": "test",
        "manifest": f"{config.date}/data/{layout.MANIFEST_FILE}",
        "identity": {
            "adapter": "tfds",
            "dataset": "fashion_mnist",
            "image_shape": [28, 28, 1],
            "class_names": factories.CLASS_NAMES,
        },
    }
    report = pathlib.Path(os.path.join(out, REPORT_FILE)).read_text()
    assert f"| accuracy | {metrics['accuracy']:.4f} |" in report
    assert f"]({CONFUSION_MATRIX_PNG})" in report and f"]({TRAINING_CURVES_PNG})" in report
    assert "| Ankle boot |" in report


def _rewrite_manifest(config: EvaluateConfig, edit) -> None:
    path = os.path.join(config.data_dir, layout.MANIFEST_FILE)
    doc = atomic.read_json(path)
    edit(doc)
    with open(path, "w") as f:
        json.dump(doc, f)


def test_declared_count_differs_from_files(make_config):
    config = make_config()

    def declare_more(doc):
        doc["splits"]["eval"]["num_examples"] = 10_000

    _rewrite_manifest(config, declare_more)
    with pytest.raises(data.EvalSplitError, match="num_examples is 10000 but its eval files hold"):
        run(config)
    assert not os.path.exists(os.path.join(config.evaluate_dir, layout.METRICS_FILE))


def test_records_read_differ_from_manifest(make_config):
    config = make_config()

    def overstate(doc):
        doc["splits"]["eval"]["num_examples"] = 301
        next(f for f in doc["files"] if f["split"] == "eval")["num_examples"] = 301

    _rewrite_manifest(config, overstate)
    with pytest.raises(data.EvalSplitError, match="read 300 eval examples but the manifest .* 301"):
        run(config)
    assert not os.path.exists(os.path.join(config.evaluate_dir, layout.METRICS_FILE))


def test_missing_model_is_named(make_config):
    config = make_config()
    os.remove(config.model_path)
    with pytest.raises(stage.TrainOutputError, match="model not found: .*model.keras"):
        run(config)


def test_other_dataset_is_refused(make_config):
    with pytest.raises(ValueError, match="is 'fashion_mnist', not 'mnist'"):
        run(make_config(dataset="mnist"))


@pytest.mark.usefixtures("quick_pictures")  # the pictures are test_writes_every_file's
def test_command_line(run_root, capsys, caplog):
    from evaluate.__main__ import main

    argv = ["--output-root", str(run_root), "--date", DATE, "--min-accuracy", "0.1"]
    assert main(argv) == 0
    assert "blessed True" in capsys.readouterr().out
    evaluate_dir = layout.evaluate_dir(str(run_root), DATE)
    assert os.path.exists(os.path.join(evaluate_dir, layout.METRICS_FILE))

    assert (
        main(["--output-root", str(run_root), "--date", "2026-02-01", "--min-accuracy", "0"]) == 1
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "manifest not found" in err[-1]
