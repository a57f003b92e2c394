"""Pushing a blessed model to serving: TF Serving layout, both signatures, checks, reruns."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from contract import atomic, layout, manifest
from contract.messages import ERROR_PREFIX, EXIT_BAD_INPUT
from evaluate import EvaluateConfig, report, run, serving, stage
from tests import factories
from tests.evaluate import trained_run
from tests.evaluate.conftest import DATE, placeholder_pictures

VERSION = "2026013100"

# The pictures are checked in test_stage.py and test_report_page.py.
pytestmark = pytest.mark.usefixtures("quick_pictures")


@pytest.fixture(autouse=True)
def no_model_server(monkeypatch, tmp_path):
    """A PATH without tensorflow_model_server: the in-process check is the one that runs."""
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


@pytest.fixture(scope="module")
def first_push(trained_template, tmp_path_factory) -> tuple[pathlib.Path, EvaluateConfig, dict]:
    """The trained run evaluated once with min_accuracy 0.1 (blessed, pushed), without
    tensorflow_model_server on PATH: (output root, config, metrics). Tests that change it
    copy it first (`pushed_copy`)."""
    template, _ = trained_template
    folder = tmp_path_factory.mktemp("first-push")
    root = folder / "runs"
    shutil.copytree(template, root)
    (folder / "empty-path").mkdir()
    config = EvaluateConfig(
        output_root=str(root),
        date=DATE,
        batch_size=128,
        min_accuracy=0.1,
        bless_without_thresholds=True,  # as `make_config` sets it
    )
    with placeholder_pictures(), pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", str(folder / "empty-path"))
        metrics = run(config)
    return root, config, metrics


@pytest.fixture
def pushed_copy(first_push, tmp_path) -> tuple[pathlib.Path, EvaluateConfig]:
    """A private copy of `first_push`'s output root (its paths are relative to the root) and
    the same evaluation's config for it."""
    root = tmp_path / "pushed" / "runs"
    shutil.copytree(first_push[0], root)
    return root, dataclasses.replace(first_push[1], output_root=str(root))


def _push_doc(config) -> dict:
    return atomic.read_json(os.path.join(config.evaluate_dir, report.PUSH_FILE))


def _eval_records(config) -> tuple[list[bytes], np.ndarray, np.ndarray]:
    """Every eval record serialised, and as (float32 images, labels)."""
    doc = atomic.read_json(os.path.join(config.data_dir, layout.MANIFEST_FILE))
    paths = manifest.split_paths(config.data_dir, doc, layout.EVAL_SPLIT)
    serialized = [bytes(r.numpy()) for r in tf.data.TFRecordDataset(paths)]
    images, labels = trained_run.read_split(config.data_dir, doc, layout.EVAL_SPLIT)
    return serialized, images, labels


def _without_label(serialized: bytes) -> bytes:
    example = tf.train.Example.FromString(serialized)
    del example.features.feature["label"]
    return example.SerializeToString()


def test_a_blessed_model_is_served_from_the_tf_serving_layout(first_push):
    run_root, config, metrics = first_push
    model_dir = run_root / "serving" / "nightly"
    assert sorted(os.listdir(model_dir)) == [VERSION]  # no temporary folder left
    version_dir = model_dir / VERSION
    assert (version_dir / "saved_model.pb").is_file()
    assert (version_dir / "variables").is_dir()

    push = _push_doc(config)
    assert push["pushed"] and push["status"] == "pushed"
    assert (push["path"], push["version"]) == (str(version_dir), 2026013100)
    assert sorted(push["signatures"]) == ["serving_default", "serving_tf_example"]
    assert push["verification"]["examples"] == stage.VERIFY_EXAMPLES
    assert push["verification"]["model_server"]["ran"] is False
    assert (
        "tensorflow_model_server is not on PATH" in push["verification"]["model_server"]["reason"]
    )
    assert metrics["push"] == {
        "pushed": True,
        "status": "pushed",
        "version": 2026013100,
        "path": str(version_dir),
    }
    marker = atomic.read_json(str(version_dir / serving.PUSH_MARKER))
    assert marker["model_sha256"] == metrics["model"]["sha256"]
    text = (run_root / DATE / "evaluate" / report.REPORT_FILE).read_text()
    assert f"Version 2026013100 of model nightly (pushed): `{version_dir}`" in text
    assert "tensorflow_model_server is not on PATH" in text

    # Loaded as a server would: both signatures on every eval example agree with Keras.
    serialized, images, _ = _eval_records(config)
    expected = tf_keras.models.load_model(config.model_path).predict(images, verbose=0)
    loaded = tf.saved_model.load(str(version_dir))
    by_images = loaded.signatures["serving_default"]
    assert by_images.structured_input_signature[1] == {
        "images": tf.TensorSpec([None, 28, 28, 1], tf.float32, name="images")
    }
    outputs = by_images(images=tf.constant(images))
    np.testing.assert_allclose(outputs["probabilities"].numpy(), expected, atol=1e-5, rtol=0)
    assert outputs["class_ids"].numpy().tolist() == expected.argmax(axis=1).tolist()
    names = [factories.CLASS_NAMES[i] for i in expected.argmax(axis=1)]
    assert [n.decode() for n in outputs["class_names"].numpy()] == names

    by_examples = loaded.signatures["serving_tf_example"]
    assert by_examples.structured_input_signature[1] == {
        "examples": tf.TensorSpec([None], tf.string, name="examples")
    }
    unlabelled = [_without_label(s) for s in serialized]  # a request carries no label
    for records in (serialized, unlabelled):
        outputs = by_examples(examples=tf.constant(records))
        np.testing.assert_allclose(outputs["probabilities"].numpy(), expected, atol=1e-5, rtol=0)


def test_an_unblessed_model_is_never_pushed(make_config, run_root):
    config = make_config(min_accuracy=0.999)
    metrics = run(config)
    push = _push_doc(config)
    assert not metrics["blessed"]
    assert push["pushed"] is False and push["status"] == "not blessed"
    assert push["version"] == 2026013100  # where it would have gone
    assert not (run_root / "serving").exists()
    text = (run_root / DATE / "evaluate" / report.REPORT_FILE).read_text()
    assert "Not pushed: only a blessed model is pushed to serving." in text


def _files(folder) -> dict[str, tuple[int, int]]:
    return {
        os.path.relpath(os.path.join(d, n), folder): (
            os.stat(os.path.join(d, n)).st_ino,
            os.stat(os.path.join(d, n)).st_mtime_ns,
        )
        for d, _, names in os.walk(folder)
        for n in names
    }


def test_a_rerun_leaves_the_pushed_version_as_it_is(pushed_copy):
    run_root, config = pushed_copy
    version_dir = run_root / "serving" / "nightly" / VERSION
    before = _files(version_dir)
    metrics = run(config)
    assert _files(version_dir) == before
    assert _push_doc(config)["status"] == "already pushed"
    assert metrics["push"]["pushed"] and metrics["push"]["version"] == 2026013100


def test_an_unfinished_push_is_redone(make_config, run_root):
    version_dir = run_root / "serving" / "nightly" / VERSION
    version_dir.mkdir(parents=True)
    (version_dir / "saved_model.pb").write_bytes(b"half a copy")  # no push marker
    killed = run_root / "serving" / "nightly" / f".tmp-{VERSION}-0123" / VERSION
    killed.mkdir(parents=True)  # what a push killed while staging leaves
    other_date = run_root / "serving" / "nightly" / ".tmp-2026013000-0123"
    other_date.mkdir()
    config = make_config(min_accuracy=0.1)
    run(config)
    assert _push_doc(config)["status"] == "pushed"
    assert (version_dir / serving.PUSH_MARKER).is_file()
    tf.saved_model.load(str(version_dir))  # the real export, not the leftover
    assert sorted(os.listdir(run_root / "serving" / "nightly")) == [other_date.name, VERSION]


def test_a_version_holding_another_model_is_never_replaced_in_place(pushed_copy):
    # TF Serving does not reload a version in place: the model goes to the date's next version
    # and the version it replaces leaves the served folder, untouched.
    run_root, config = pushed_copy
    version_dir = run_root / "serving" / "nightly" / VERSION
    marker_path = str(version_dir / serving.PUSH_MARKER)
    atomic.write_json_atomic(
        marker_path, atomic.read_json(marker_path) | {"model_sha256": "0" * 64}
    )
    before = _files(version_dir)
    os.remove(os.path.join(config.evaluate_dir, layout.METRICS_FILE))
    metrics = run(config)
    assert metrics["push"]["version"] == 2026013101
    assert sorted(os.listdir(run_root / "serving" / "nightly")) == ["2026013101"]
    (moved,) = os.listdir(run_root / "serving" / "nightly.quarantine")
    quarantined = run_root / "serving" / "nightly.quarantine" / moved
    assert {k: v for k, v in _files(quarantined).items() if k in before} == {
        k: v for k, v in before.items() if k != serving.PUSH_MARKER
    } or moved.startswith(VERSION + "-")
    assert atomic.read_json(str(quarantined / serving.PUSH_MARKER))["model_sha256"] == "0" * 64


def test_an_export_base_that_is_a_file_is_one_error_line(run_root, tmp_path, capsys):
    from evaluate.__main__ import main

    base = tmp_path / "serving-file"
    base.write_text("not a folder")
    argv = ["--output-root", str(run_root), "--date", DATE, "--export-base", str(base)]
    assert main([*argv, "--min-accuracy", "0"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"{ERROR_PREFIX}export base {base} is a file, not a folder: pass an export base folder "
        "(default <output_root>/serving) or move the file away"
    ]
    assert not os.path.exists(layout.evaluate_dir(str(run_root), DATE))


def _request(model, tmp_path, serialized, image_shape) -> serving.PushRequest:
    return serving.PushRequest(
        model=model,
        model_sha256="a" * 64,
        export_base=str(tmp_path / "serving"),
        model_name="custom",
        date="2026-02-03",
        image_shape=image_shape,
        class_names=factories.CLASS_NAMES,
        serialized_examples=serialized,
    )


def test_any_keras_model_exports_with_its_own_input_dtype(make_config, tmp_path):
    # A model taking uint8 pixels (not the built-in models' float32): serving_default takes
    # uint8 and the tf.Example signature feeds it uint8.
    serialized, images, _ = _eval_records(make_config())
    inputs = tf_keras.Input(shape=[28, 28, 1], dtype="uint8")
    x = tf_keras.layers.Rescaling(1.0 / 255)(inputs)
    x = tf_keras.layers.Conv2D(4, 3, activation="relu")(x)
    x = tf_keras.layers.GlobalAveragePooling2D()(x)
    model = tf_keras.Model(inputs, tf_keras.layers.Dense(10, activation="softmax")(x))
    push = serving.push(_request(model, tmp_path, serialized[:64], [28, 28, 1]))
    assert push["path"] == str(tmp_path / "serving" / "custom" / "2026020300")
    loaded = tf.saved_model.load(push["path"])
    spec = loaded.signatures["serving_default"].structured_input_signature[1]["images"]
    assert spec.dtype == tf.uint8
    expected = model(images[:64].astype(np.uint8)).numpy()
    got = loaded.signatures["serving_tf_example"](examples=tf.constant(serialized[:64]))
    np.testing.assert_allclose(got["probabilities"].numpy(), expected, atol=1e-5, rtol=0)


def test_an_export_that_predicts_otherwise_is_caught(make_config, tmp_path):
    serialized, _, _ = _eval_records(make_config())
    exported = trained_run.tiny_model([28, 28, 1], 10, seed=0)
    other = trained_run.tiny_model([28, 28, 1], 10, seed=1)
    request = _request(exported, tmp_path, serialized[:32], [28, 28, 1])
    folder = str(tmp_path / "export")
    serving.export(exported, [28, 28, 1], factories.CLASS_NAMES, folder)
    assert serving.verify(request, folder)["max_abs_difference"]["serving_default"] <= 1e-5
    with pytest.raises(serving.ExportError, match="predicts up to .* away from the Keras model"):
        serving.verify(_request(other, tmp_path, serialized[:32], [28, 28, 1]), folder)


@pytest.fixture
def model_server_on_path(monkeypatch, tmp_path):
    """`tensorflow_model_server` on PATH: the stand-in of tests.evaluate.fake_model_server."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "tensorflow_model_server"
    script.write_text(
        f'#!/bin/sh\ncd "{factories.PROJECT_ROOT}"\n'
        f'exec "{sys.executable}" -m tests.evaluate.fake_model_server "$@"\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))


def test_an_installed_model_server_loads_and_answers_before_the_push(
    make_config, run_root, model_server_on_path
):
    config = make_config(min_accuracy=0.1)
    run(config)
    server = _push_doc(config)["verification"]["model_server"]
    assert server["ran"] is True and server["examples"] == 32
    assert set(server["max_abs_difference"]) == {"serving_default", "serving_tf_example"}
    assert max(server["max_abs_difference"].values()) <= 2e-5
    text = (run_root / DATE / "evaluate" / report.REPORT_FILE).read_text()
    assert "tensorflow_model_server loaded and answered it too" in text


def test_a_model_server_answering_otherwise_stops_the_push(
    make_config, run_root, model_server_on_path, monkeypatch
):
    monkeypatch.setenv("FAKE_MODEL_SERVER_OFFSET", "0.01")
    config = make_config(min_accuracy=0.1)
    with pytest.raises(serving.ExportError, match="answered serving_default up to 0.01"):
        run(config)
    assert sorted(os.listdir(run_root / "serving" / "nightly")) == []
    assert not os.path.exists(os.path.join(config.evaluate_dir, layout.METRICS_FILE))


class _Subclassed(tf_keras.Model):
    """A model that declares no input (subclassed), as a user's model may be."""

    def __init__(self) -> None:
        super().__init__()
        self.flatten = tf_keras.layers.Flatten()
        self.dense = tf_keras.layers.Dense(10, activation="softmax")

    def call(self, images, training=False):
        return self.dense(self.flatten(images / 255.0))


def test_a_subclassed_model_exports_with_the_contracts_float_input(make_config, tmp_path):
    serialized, images, _ = _eval_records(make_config())
    model = _Subclassed()
    model(images[:1])  # builds the weights
    push = serving.push(_request(model, tmp_path, serialized[:64], [28, 28, 1]))
    loaded = tf.saved_model.load(push["path"])
    spec = loaded.signatures["serving_default"].structured_input_signature[1]["images"]
    assert spec == tf.TensorSpec([None, 28, 28, 1], tf.float32, name="images")
    got = loaded.signatures["serving_default"](images=tf.constant(images[:64]))
    np.testing.assert_allclose(
        got["probabilities"].numpy(), model(images[:64]).numpy(), atol=1e-5, rtol=0
    )


def test_a_mixed_bfloat16_model_is_pushed_and_serves_what_keras_predicts(make_config, tmp_path):
    # On a CPU with AMX, the bfloat16 kernels of a compiled function (fused with batch
    # normalisation's trained statistics) round otherwise than an eager call's, by up to 0.02
    # here: the export is held to Keras's `predict`, which is a compiled function too.
    from train import models

    serialized, images, labels = _eval_records(make_config())
    try:
        model = models.build("mlp", [28, 28, 1], 10, "mixed_bfloat16")
        model.compile(tf_keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
        model.fit(images, labels, batch_size=32, epochs=2, verbose=0)
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")
    push = serving.push(_request(model, tmp_path, serialized[:64], [28, 28, 1]))
    assert push["verification"]["max_abs_difference"]["serving_default"] <= 1e-5
    loaded = tf.saved_model.load(push["path"])
    got = loaded.signatures["serving_default"](images=tf.constant(images[:64]))
    np.testing.assert_allclose(
        got["probabilities"].numpy(),
        model.predict(images[:64], batch_size=64, verbose=0),
        atol=1e-5,
        rtol=0,
    )


class _KerasFileFormat:
    """A second export format, as a user would add one: the Keras file itself."""

    name = "keras_file"
    last_files = ("model.keras",)

    def export(self, request, version_dir):
        os.makedirs(version_dir)
        request.model.save(os.path.join(version_dir, "model.keras"))

    def verify(self, request, version_dir):
        loaded = tf_keras.models.load_model(os.path.join(version_dir, "model.keras"))
        images = serving.decode_examples(request.serialized_examples, request.image_shape)
        expected = serving.keras_predictions(request.model, images.astype("float32"))
        got = serving.keras_predictions(loaded, images.astype("float32"))
        if not np.allclose(got, expected, atol=1e-6):
            raise ValueError("the reloaded Keras file predicts otherwise")
        return {"examples": len(images)}


def test_another_export_format_pushes_through_the_same_push(make_config, tmp_path):
    from evaluate.config import EXPORT_FORMATS

    assert tuple(serving.FORMATS) == EXPORT_FORMATS  # the config's choices are the registry's
    serialized, _, _ = _eval_records(make_config())
    model = tf_keras.models.load_model(make_config().model_path)
    request = _request(model, tmp_path, serialized[:32], [28, 28, 1])
    push = serving.push(request, _KerasFileFormat())
    version_dir = os.path.join(push["path"])
    assert push["format"] == "keras_file" and push["status"] == "pushed"
    assert sorted(os.listdir(version_dir)) == ["assets.extra", "model.keras"]
    assert serving.read_marker(version_dir)["model_sha256"] == request.model_sha256
    assert serving.push(request, _KerasFileFormat())["status"] == "already pushed"
