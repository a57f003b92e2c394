"""The nightly loop on daily drops through the luigi command line: two dated nights of a rolling
window end to end (the first, with a day of its window missing, stopped by the data gate until
one day is allowed), and a drifted drop after them stopped by the data gate before training."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from contract import records
from preprocess import make_drops
from tests import factories
from tests.factories import PROJECT_ROOT

pytestmark = pytest.mark.e2e

RETCODE_TASK_FAILED = 30  # luigi.cfg [retcode]
PER_DAY = 300


@pytest.fixture(scope="module")
def drop_folder(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("drops") / "drops"
    make_drops.make_drops(
        str(out), 2, "2026-01-01", seed=0, per_day=PER_DAY, test_examples=200,
        source_dir=str(factories.FASHION_MNIST_DIR),
    )  # fmt: skip
    return out


def luigi(root: pathlib.Path, drops: pathlib.Path, date: str, *extra: str, task: str = "FullRun"):
    dataset = f"drops:train={drops}/{{YYYY}}-{{MM}}-{{DD}}/*.tfrecord,test={drops}/test/*.tfrecord"
    command = [
        sys.executable, "-m", "luigi", "--module", "pipeline", task, "--local-scheduler",
        f"--date={date}", f"--output-root={root}", f"--dataset={dataset}", "--num-workers=1",
        "--Preprocess-raw-image-shape=28x28x1", "--Preprocess-window-days=2",
        "--Preprocess-beam-args=--runner=DirectRunner --direct_num_workers=1",
        "--Train-model=mlp", "--Train-epochs=1", "--Train-warmup-epochs=0",
        "--Train-per-worker-batch-size=32", "--Evaluate-min-accuracy=0", *extra,
    ]  # fmt: skip
    env = os.environ | {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(
        command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def read(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def two_nights(drop_folder, tmp_path_factory) -> dict:
    """The first two nights in one root, run once: the first refused by the gate for a missing
    day, then let through with one day enough; the second on a full window."""
    root = tmp_path_factory.mktemp("nights") / "runs"
    # The first night's window has one of its two days: the gate stops it, unless told that
    # one day is enough.
    short = luigi(root, drop_folder, "2026-01-01")
    schema_after_short = (root / "data_gate" / "schema.pbtxt").exists()
    first = luigi(root, drop_folder, "2026-01-01", "--DataGate-min-window-days=1")
    second = luigi(root, drop_folder, "2026-01-02")
    return {
        "root": root,
        "short": short,
        "schema_after_short": schema_after_short,
        "first": first,
        "second": second,
    }


def test_two_nights_on_a_rolling_window_of_drops(two_nights):
    root, short = two_nights["root"], two_nights["short"]
    assert short.returncode == RETCODE_TASK_FAILED
    assert "[preprocess] drops: no files for 2025-12-31 in the 2-day window" in short.stderr
    assert "has files for 1 of its days (none for 2025-12-31), fewer than min_window_days 2" in (
        short.stdout + short.stderr
    )
    assert not two_nights["schema_after_short"]
    first = two_nights["first"]
    assert first.returncode == 0, first.stderr[-3000:]
    manifest = read(root / "2026-01-01" / "data" / "manifest.json")
    assert manifest["drops"]["missing_days"] == ["2025-12-31"]
    assert manifest["drops"]["days_read"] == ["2026-01-01"]
    gate = read(root / "2026-01-01" / "data" / "data_gate.json")
    assert gate["status"] == "passed" and gate["schema"]["inferred_now"] is True
    assert (root / "2026-01-01" / "evaluate" / "metrics.json").is_file()

    second = two_nights["second"]
    assert second.returncode == 0, second.stderr[-3000:]
    manifest = read(root / "2026-01-02" / "data" / "manifest.json")
    assert manifest["drops"]["days_read"] == ["2026-01-01", "2026-01-02"]
    assert manifest["drops"]["missing_days"] == []
    held = (
        manifest["splits"]["train"]["num_examples"]
        + manifest["splits"]["validation"]["num_examples"]
    )
    assert held == 2 * PER_DAY
    gate = read(root / "2026-01-02" / "data" / "data_gate.json")
    assert gate["baseline_date"] == "2026-01-01" and gate["schema"]["inferred_now"] is False
    assert "[data-gate] passed against 2026-01-01 (label_linf " in second.stderr
    metrics = read(root / "2026-01-02" / "evaluate" / "metrics.json")
    assert metrics["num_examples"] == 200  # the fixed test files, the same both nights


def write_drifted_drop(folder: pathlib.Path) -> None:
    """A day whose drop holds only two classes (real images)."""
    images, labels = factories.fashion_mnist_arrays("train", 3000)
    keep = np.flatnonzero(labels < 2)[:PER_DAY]
    folder.mkdir(parents=True)
    with tf.io.TFRecordWriter(str(folder / "part-00000.tfrecord")) as writer:
        for i in keep:
            writer.write(records.encode_example(images[i], int(labels[i])))


def test_a_drifted_drop_stops_before_train_and_the_override_lets_it_through(
    drop_folder, two_nights, tmp_path
):
    # After the two nights (a copy of their root), the same dataset's next day's drop drifted:
    # it lands in the same folder of drops, as another folder would be another dataset, which
    # the root's lineage refuses before the gate looks.
    assert two_nights["second"].returncode == 0, two_nights["second"].stderr[-3000:]
    root = tmp_path / "runs"
    shutil.copytree(two_nights["root"], root, symlinks=True)
    write_drifted_drop(drop_folder / "2026-01-03")

    stopped = luigi(root, drop_folder, "2026-01-03", "--Preprocess-window-days=1")
    assert stopped.returncode == RETCODE_TASK_FAILED
    output = stopped.stdout + stopped.stderr
    assert "data gate: the label distribution moved by L-infinity" in output
    assert "--DataGate-accept-anomalies" in output
    night = root / "2026-01-03"
    anomalies = read(night / "data" / "anomalies.json")["anomalies"]
    assert anomalies[0]["check"] == "label_drift" and anomalies[0]["baseline_date"] == "2026-01-02"
    assert not (night / "train").exists() and not (night / "data" / "data_gate.json").exists()

    accepted = luigi(
        root, drop_folder, "2026-01-03", "--Preprocess-window-days=1",
        "--DataGate-accept-anomalies",
        task="DataGate",
    )  # fmt: skip
    assert accepted.returncode == 0, accepted.stderr[-3000:]
    assert read(night / "data" / "data_gate.json")["status"] == "accepted"
