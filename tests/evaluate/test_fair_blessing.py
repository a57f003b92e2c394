"""The candidate and the last blessed model are scored on the same (this run's) eval set."""

from __future__ import annotations

import os
import pathlib

import pytest
import tf_keras

from contract import atomic, layout, lineage
from contract import pointer as latest
from evaluate import paired, predictions, report, run
from tests.evaluate import trained_run
from tests.evaluate.conftest import DATE

BASELINE_DATE = "2026-01-30"

# The pictures are checked in test_stage.py and test_report_page.py.
pytestmark = pytest.mark.usefixtures("quick_pictures")


def _verdict(config) -> dict:
    return atomic.read_json(os.path.join(config.evaluate_dir, layout.BLESSING_FILE))


def _eval_split(config):
    doc = atomic.read_json(os.path.join(config.data_dir, layout.MANIFEST_FILE))
    return trained_run.read_split(config.data_dir, doc, layout.EVAL_SPLIT)


def _keras_accuracy(model: tf_keras.Model, images, labels) -> float:
    predictions = model.predict(images, batch_size=64, verbose=0).argmax(axis=1)
    return float((predictions == labels).mean())


def test_the_same_model_as_baseline_is_no_regression_whatever_its_night_recorded(
    make_config, run_root
):
    # The pointer says the model scored 0.999 on its own night; on this eval set it scores what
    # the candidate scores, so an allowed drop of 0 passes. Compared with the recorded number it
    # would fail. (The pointer, as written before pointers recorded their dataset's identity,
    # is compared.)
    config = make_config(max_regression=0.0, max_relative_regression=0.0)
    model = tf_keras.models.load_model(config.model_path)
    trained_run.write_blessed_model(str(run_root), BASELINE_DATE, model, recorded_accuracy=0.999)
    metrics = run(config)
    verdict = _verdict(config)
    assert verdict["blessed"] and metrics["blessed"]
    assert verdict["baseline"]["scored"] and not verdict["fallback"]
    assert verdict["baseline"]["accuracy"] == metrics["accuracy"] < 0.999
    assert verdict["baseline"]["recorded_accuracy"] == 0.999
    assert [(c["name"], c["value"], c["passed"]) for c in verdict["checks"]] == [
        ("max_regression", 0.0, True),
        ("max_relative_regression", 0.0, True),
    ]


def test_a_better_baseline_on_this_eval_set_blocks_the_candidate(make_config, run_root):
    config = make_config(min_accuracy=0.1, max_regression=0.0)
    doc = atomic.read_json(os.path.join(config.data_dir, layout.MANIFEST_FILE))
    images, labels = trained_run.read_split(config.data_dir, doc, layout.TRAIN_SPLIT)
    better = trained_run.tiny_model(doc["image_shape"], doc["num_classes"], seed=1)
    better.fit(images, labels, batch_size=64, epochs=12, verbose=0)
    trained_run.write_blessed_model(str(run_root), BASELINE_DATE, better, recorded_accuracy=0.5)

    metrics = run(config)
    verdict = _verdict(config)
    eval_images, eval_labels = _eval_split(config)
    baseline_accuracy = _keras_accuracy(better, eval_images, eval_labels)
    candidate = tf_keras.models.load_model(config.model_path)
    assert metrics["accuracy"] == pytest.approx(
        _keras_accuracy(candidate, eval_images, eval_labels)
    )
    assert baseline_accuracy > metrics["accuracy"]  # the premise: the baseline is better here
    assert verdict["baseline"]["accuracy"] == pytest.approx(baseline_accuracy)
    assert verdict["candidate"]["accuracy"] == metrics["accuracy"]
    assert metrics["baseline_accuracy"] == verdict["baseline"]["accuracy"]
    assert not verdict["blessed"] and not metrics["blessed"]
    assert [(c["name"], c["passed"]) for c in verdict["checks"]] == [
        ("min_accuracy", True),
        ("max_regression", False),
    ]
    text = pathlib.Path(config.evaluate_dir, report.REPORT_FILE).read_text()
    assert (
        f"On this eval set: candidate accuracy {metrics['accuracy']:.4f}, last blessed model "
        f"({BASELINE_DATE}) {baseline_accuracy:.4f}." in text
    )
    assert "| max_regression |" in text and "| FAIL |" in text
    # Not blessed: the pointer stays on the baseline.
    pointer = atomic.read_json(os.path.join(run_root, layout.LATEST_POINTER_FILE))
    assert pointer["date"] == BASELINE_DATE


def _other_input_shape(run_root, config) -> str:
    model = trained_run.tiny_model([14, 14, 1], 10)
    trained_run.write_blessed_model(str(run_root), BASELINE_DATE, model, recorded_accuracy=0.99)
    return "it takes inputs of shape [14, 14, 1], this run's images are [28, 28, 1]"


def _missing_file(run_root, config) -> str:
    _same_model(run_root, config)
    os.remove(layout.join(layout.train_dir(str(run_root), BASELINE_DATE), layout.MODEL_FILE))
    return f"its model file {run_root}/{BASELINE_DATE}/train/model.keras is missing"


def _altered_file(run_root, config) -> str:
    _same_model(run_root, config)
    path = layout.join(layout.train_dir(str(run_root), BASELINE_DATE), layout.MODEL_FILE)
    with open(path, "ab") as f:
        f.write(b"\0")
    return "recorded in the latest pointer"


def _unloadable_file(run_root, config) -> str:
    current = _same_model(run_root, config)
    path = layout.join(layout.train_dir(str(run_root), BASELINE_DATE), layout.MODEL_FILE)
    with open(path, "wb") as f:
        f.write(b"not a keras file")
    current["model_sha256"] = atomic.sha256_file(path)
    atomic.write_json_atomic(os.path.join(run_root, layout.LATEST_POINTER_FILE), current)
    return "does not load"


def _no_recorded_sha256(run_root, config) -> str:
    current = _same_model(run_root, config)
    current.pop("model_sha256")
    atomic.write_json_atomic(os.path.join(run_root, layout.LATEST_POINTER_FILE), current)
    return "records no model_sha256"


def _another_lineage(run_root, config) -> str:
    # The same model, so scoring it would work: only the identity the pointer records differs.
    current = _same_model(run_root, config)
    doc = atomic.read_json(os.path.join(config.data_dir, layout.MANIFEST_FILE))
    renamed = ["sandal", *doc["class_names"][1:]]
    current[latest.IDENTITY_KEY] = lineage.identity(doc) | {"class_names": renamed}
    atomic.write_json_atomic(os.path.join(run_root, layout.LATEST_POINTER_FILE), current)
    return (
        f"it is a model of another dataset lineage (class 0 named 'sandal', not "
        f"{doc['class_names'][0]!r}): not compared"
    )


def _same_model(run_root, config) -> dict:
    model = tf_keras.models.load_model(config.model_path)
    return trained_run.write_blessed_model(
        str(run_root), BASELINE_DATE, model, recorded_accuracy=0.99
    )


@pytest.mark.parametrize(
    "break_baseline",
    [
        _other_input_shape,
        _missing_file,
        _altered_file,
        _unloadable_file,
        _no_recorded_sha256,
        _another_lineage,
    ],
)
def test_a_baseline_that_cannot_be_scored_falls_back_to_the_value_threshold(
    make_config, run_root, break_baseline
):
    config = make_config(min_accuracy=0.1, max_regression=0.0, max_relative_regression=0.0)
    reason = break_baseline(run_root, config)
    metrics = run(config)
    verdict = _verdict(config)
    assert verdict["blessed"] and verdict["fallback"]
    assert verdict["baseline"]["scored"] is False and verdict["baseline"]["accuracy"] is None
    assert reason in verdict["baseline"]["unscored_reason"]
    assert [c["name"] for c in verdict["checks"]] == ["min_accuracy"]
    assert any("judged on the value threshold only" in r for r in verdict["reasons"])
    text = pathlib.Path(config.evaluate_dir, report.REPORT_FILE).read_text()
    assert f"The last blessed model ({BASELINE_DATE}) could not be scored on this eval set" in text
    assert metrics["baseline_accuracy"] is None
    # Blessed on the value threshold: the pointer moves to this run, and records its dataset.
    pointer = atomic.read_json(os.path.join(run_root, layout.LATEST_POINTER_FILE))
    assert pointer["date"] == DATE
    doc = atomic.read_json(os.path.join(config.data_dir, layout.MANIFEST_FILE))
    assert pointer[latest.IDENTITY_KEY] == lineage.identity(doc) == metrics["dataset"]["identity"]
    assert pointer[latest.IDENTITY_KEY]["class_names"] == doc["class_names"]


def test_an_unfinished_evaluation_named_by_the_pointer_is_no_baseline(make_config, run_root):
    config = make_config(max_regression=0.0)
    current = _same_model(run_root, config)
    current["metrics_path"] = f"{BASELINE_DATE}/evaluate/metrics.json"  # never written
    atomic.write_json_atomic(os.path.join(run_root, layout.LATEST_POINTER_FILE), current)
    run(config)
    verdict = _verdict(config)
    assert verdict["baseline"] is None and verdict["blessed"]


def test_per_example_predictions_are_kept_and_recompute_the_verdict(make_config, run_root):
    config = make_config(min_accuracy=0.1, max_regression=0.05)
    doc = atomic.read_json(os.path.join(config.data_dir, layout.MANIFEST_FILE))
    images, labels = trained_run.read_split(config.data_dir, doc, layout.TRAIN_SPLIT)
    other = trained_run.tiny_model(doc["image_shape"], doc["num_classes"], seed=2)
    other.fit(images, labels, batch_size=64, epochs=3, verbose=0)
    trained_run.write_blessed_model(str(run_root), BASELINE_DATE, other, recorded_accuracy=0.5)

    metrics = run(config)
    verdict = _verdict(config)
    candidate = predictions.read(os.path.join(config.evaluate_dir, predictions.CANDIDATE_FILE))
    baseline = predictions.read(os.path.join(config.evaluate_dir, predictions.BASELINE_FILE))
    _, eval_labels = _eval_split(config)
    assert candidate.labels.tolist() == baseline.labels.tolist() == eval_labels.tolist()
    assert candidate.correct.mean() == pytest.approx(metrics["accuracy"])
    assert baseline.correct.mean() == pytest.approx(verdict["baseline"]["accuracy"])
    again = paired.compare(candidate.correct, baseline.correct, confidence=config.confidence)
    assert verdict["comparison"] == again.document() == metrics["comparison"]
    assert again.candidate_only + again.baseline_only > 0  # two different models
    (check,) = [c for c in verdict["checks"] if c["name"] == "max_regression"]
    assert check["value"] == again.lower and check["passed"] is (again.lower >= -0.05)
    assert metrics["calibration"] == predictions.calibration(candidate)
    assert 0.0 <= metrics["calibration"]["ece"] <= 1.0
    text = pathlib.Path(config.evaluate_dir, report.REPORT_FILE).read_text()
    assert f"**{again.verdict}**" in text and f"p = {again.p_value:.3g}" in text
    assert f"Expected calibration error {metrics['calibration']['ece']:.4f}" in text

    # Without a baseline, no baseline predictions are left from an earlier verdict.
    os.remove(os.path.join(run_root, layout.LATEST_POINTER_FILE))
    os.remove(os.path.join(config.evaluate_dir, layout.METRICS_FILE))
    run(config)
    assert not os.path.exists(os.path.join(config.evaluate_dir, predictions.BASELINE_FILE))
    assert _verdict(config)["comparison"] is None
