"""Two workers on loopback train end to end: artefacts, history, exact validation, TensorBoard."""

from __future__ import annotations

import collections
import glob
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from contract import layout, manifest, records
from tests import forked
from tests.train.conftest import (
    NUM_VALIDATION,
    SMALL_RUN,
    launch_argv,
    log_text,
    train_env,
    write_small_shard_set,
)

pytestmark = pytest.mark.slow

STEPS_PER_EPOCH = 256 // SMALL_RUN["per_worker_batch_size"]
TOTAL_STEPS = SMALL_RUN["epochs"] * STEPS_PER_EPOCH
# TensorFlow logs each collective it launches ("Collective ExecuteAsync start for <op>: ...")
# at this verbosity of its collective kernels.
COLLECTIVE_LOG_MODULE = "collective_ops=2"
COLLECTIVE_LAUNCH = re.compile(r"Collective ExecuteAsync start for (\S+):")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One small two-worker run shared by the tests of this module: (data_dir, train_dir, proc).

    With test-time flips, so that the exact validation is checked on the exported model that
    scores each image and its mirror.
    """
    root = tmp_path_factory.mktemp("two_workers")
    data_dir, train_dir = str(root / "data"), str(root / "train")
    write_small_shard_set(data_dir)
    proc = forked.run(
        launch_argv(data_dir, train_dir, test_time_augment="flip"),
        env=train_env(TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE=COLLECTIVE_LOG_MODULE),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return data_dir, train_dir, proc


def read_history(train_dir: str) -> dict:
    with open(os.path.join(train_dir, layout.HISTORY_FILE)) as f:
        return json.load(f)


def test_artefacts_present_and_model_loads(finished_run):
    _, train_dir, _ = finished_run
    for name in (layout.MODEL_FILE, layout.HISTORY_FILE, layout.TRAIN_CONFIG_FILE):
        assert os.path.isfile(os.path.join(train_dir, name)), name
    assert glob.glob(os.path.join(train_dir, layout.FINAL_CHECKPOINT_DIR, "*.index"))
    model = keras.models.load_model(os.path.join(train_dir, layout.MODEL_FILE))
    assert "mirror" in [layer.name for layer in model.layers]  # test-time flips exported
    probabilities = model.predict(np.full([3, 28, 28, 1], 128.0, np.float32), verbose=0)
    assert probabilities.shape == (3, 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    with open(os.path.join(train_dir, layout.TRAIN_CONFIG_FILE)) as f:
        assert json.load(f)["model"] == SMALL_RUN["model"]


def test_history_is_sane(finished_run):
    _, train_dir, _ = finished_run
    doc = read_history(train_dir)
    epochs = SMALL_RUN["epochs"]
    for key in ("loss", "accuracy", "val_loss", "val_accuracy", "learning_rate"):
        assert len(doc["history"][key]) == epochs, key
    assert doc["epochs_completed"] == epochs
    assert doc["steps_trained_total"] == TOTAL_STEPS
    assert doc["num_workers"] == 2
    assert doc["global_batch_size"] == 2 * SMALL_RUN["per_worker_batch_size"]
    assert doc["model"] == "mlp" and doc["stopped_early"] is False
    assert 1 <= doc["best_epoch"] <= epochs
    # Timings are recorded as numbers; how large they are is for bench/, not here.
    for key in ("examples_per_second", "wall_time_seconds", "fit_return_seconds"):
        assert isinstance(doc[key], float), key
    assert doc["history"]["loss"][-1] < doc["history"]["loss"][0]
    assert all(0.0 <= a <= 1.0 for a in doc["history"]["val_accuracy"])


def test_chief_progress_reaches_the_console(finished_run):
    _, _, proc = finished_run
    progress = [line for line in proc.stdout.splitlines() if line.startswith("PROGRESS ")]
    assert [json.loads(line[len("PROGRESS ") :])["epoch"] for line in progress] == [1, 2, 3]


def test_each_worker_logs_to_its_own_file(finished_run):
    _, train_dir, _ = finished_run
    for worker in (0, 1):
        with open(os.path.join(train_dir, "logs", f"worker-{worker}.log")) as f:
            text = f.read()
        assert f"worker {worker} of 2" in text
        assert f"END steps_executed={TOTAL_STEPS} final_step={TOTAL_STEPS}" in text


def test_a_training_step_runs_one_collective_the_gradient_all_reduce(finished_run):
    """Keras would also read every metric across workers and sum the step's outputs (six
    collectives a step), and tf.distribute would ask whether any worker still has data."""
    _, train_dir, _ = finished_run
    launched = collections.Counter(COLLECTIVE_LAUNCH.findall(log_text(train_dir, 1)))
    assert launched, f"no collective launches logged (TF_CPP_VMODULE={COLLECTIVE_LOG_MODULE})"
    every_step = sorted(op for op, count in launched.items() if count >= TOTAL_STEPS)
    assert len(every_step) == 1, f"collectives run at least once a step: {launched}"


def test_validation_is_exact_over_every_example(finished_run):
    """The distributed val metrics equal one process scoring the saved weights on all 203."""
    data_dir, train_dir, _ = finished_run
    doc = read_history(train_dir)
    shard_manifest = manifest.read_manifest(data_dir)
    files = manifest.split_paths(data_dir, shard_manifest, layout.VALIDATION_SPLIT)
    serialized = list(tf.data.TFRecordDataset(files).as_numpy_iterator())
    images, labels = records.parse_batch(tf.constant(serialized), [28, 28, 1])
    assert len(labels) == NUM_VALIDATION == doc["validation_examples"]
    model = keras.models.load_model(os.path.join(train_dir, layout.MODEL_FILE))
    probabilities = model.predict(tf.cast(images, tf.float32), batch_size=203, verbose=0)
    losses = keras.losses.sparse_categorical_crossentropy(labels, probabilities).numpy()
    accuracy = np.mean(np.argmax(probabilities, axis=1) == labels.numpy())
    assert abs(doc["history"]["val_loss"][-1] - losses.astype(np.float64).mean()) < 1e-5
    assert abs(doc["history"]["val_accuracy"][-1] - accuracy) < 1e-9


def _event_accumulator(train_dir: str):
    """TensorBoard's own reader over the chief's event file."""
    from tensorboard.backend.event_processing import event_accumulator

    accumulator = event_accumulator.EventAccumulator(
        os.path.join(train_dir, layout.TENSORBOARD_DIR),
        size_guidance={event_accumulator.TENSORS: 0},  # keep every event
    )
    accumulator.Reload()
    return accumulator


def test_tensorboard_reads_scalars_learning_rate_and_gradient_histograms(finished_run):
    _, train_dir, _ = finished_run
    accumulator = _event_accumulator(train_dir)
    tags = set(accumulator.Tags()["tensors"])
    doc = read_history(train_dir)
    for name in ("loss", "accuracy", "val_loss", "val_accuracy", "learning_rate"):
        events = accumulator.Tensors(f"epoch/{name}")
        assert [e.step for e in events] == [1, 2, 3]
        assert accumulator.SummaryMetadata(f"epoch/{name}").plugin_data.plugin_name == "scalars"
        values = [float(tf.make_ndarray(e.tensor_proto)) for e in events]
        assert values == pytest.approx(doc["history"][name], rel=1e-6)
    for name in ("loss", "accuracy"):
        # All workers' running means: at an epoch's last step, the epoch's value.
        by_step = {
            e.step: float(tf.make_ndarray(e.tensor_proto))
            for e in accumulator.Tensors(f"step/{name}")
        }
        epoch_ends = range(STEPS_PER_EPOCH, TOTAL_STEPS + 1, STEPS_PER_EPOCH)
        assert [by_step[step] for step in epoch_ends] == pytest.approx(
            doc["history"][name], rel=1e-6
        )
    step_rates = accumulator.Tensors("step/learning_rate")
    assert [e.step for e in step_rates] == list(
        range(SMALL_RUN["scalar_freq_steps"], TOTAL_STEPS + 1, SMALL_RUN["scalar_freq_steps"])
    )
    assert float(tf.make_ndarray(step_rates[0].tensor_proto)) == pytest.approx(3e-3)
    gradients = sorted(t for t in tags if t.startswith("gradients/"))
    model = keras.models.load_model(os.path.join(train_dir, layout.MODEL_FILE))
    assert len(gradients) == len(model.trainable_variables)
    for tag in gradients:
        assert accumulator.SummaryMetadata(tag).plugin_data.plugin_name == "histograms"
        events = accumulator.Tensors(tag)
        assert [e.step for e in events] == list(
            range(0, TOTAL_STEPS, SMALL_RUN["histogram_freq_steps"])
        )
        buckets = tf.make_ndarray(events[-1].tensor_proto)  # [bucket, (left, right, count)]
        assert buckets.shape[1] == 3 and buckets[:, 2].sum() > 0


def test_only_the_chief_leaves_files(finished_run):
    _, train_dir, _ = finished_run
    leftovers = [
        p for p in glob.glob(os.path.join(train_dir, "**"), recursive=True) if "workertemp" in p
    ]
    assert leftovers == []
    assert not os.path.exists(os.path.join(train_dir, layout.BACKUP_DIR))
    assert (
        len(
            glob.glob(
                os.path.join(train_dir, layout.TENSORBOARD_DIR, "**", "events.*"), recursive=True
            )
        )
        == 1
    )
