"""Pushing to a gs:// export base, against the local GCS emulator (no cloud).

The stage runs as `python -m evaluate` in its own process with the emulator's environment,
started as the pipeline starts its stages (contract.spawn: forked from the session's warm fork
server when one serves); the bucket is read back through google-cloud-storage, another client
than the stage's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from contract import gfile, spawn, storage
from evaluate import serving
from tests import gcs_emulator
from tests.evaluate.conftest import DATE

pytestmark = pytest.mark.e2e

BUCKET = "bucket"
ROOT = f"gs://{BUCKET}/runs"
VERSION_PREFIX = "runs/serving/nightly/2026013100/"


@pytest.fixture(scope="module")
def gcs_env(tmp_path_factory):
    """The emulator and its proxy on free loopback ports; yields the clients' environment."""
    workdir = tmp_path_factory.mktemp("gcs")
    with gcs_emulator.running(workdir, BUCKET) as env:
        yield env | {storage.STATE_DIR_ENV: str(workdir / "state")}


@pytest.fixture
def bucket(gcs_env, monkeypatch):
    from google.cloud import storage as gcs_client

    for key, value in gcs_env.items():
        monkeypatch.setenv(key, value)
    return gcs_client.Client().bucket(BUCKET)


def _env(gcs_env) -> dict[str, str]:
    """A client process's environment: the emulator's, and this venv's programs on PATH."""
    return os.environ | gcs_env | {"PATH": os.path.dirname(sys.executable)}


def _evaluate(gcs_env, *args: str) -> tuple[int, str]:
    """Runs `python -m evaluate *args` as the pipeline does; returns its exit code and its
    output (stdout and stderr together)."""
    process = spawn.popen(
        [sys.executable, "-m", "evaluate", *args],
        env=_env(gcs_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert process.stdout is not None
        output = process.stdout.read().decode(errors="replace")
        return process.wait(timeout=600), output
    finally:
        if process.poll() is None:
            process.kill()


def _objects(bucket, prefix: str) -> dict[str, int]:
    return {
        blob.name[len(prefix) :]: blob.generation
        for blob in bucket.client.list_blobs(bucket, prefix=prefix)
        if not blob.name.endswith("/")
    }


def test_push_to_a_gs_export_base_and_rerun(gcs_env, bucket, run_root, tmp_path):
    gfile.upload_folder(str(run_root / DATE), f"{ROOT}/{DATE}")  # with the bucket's environment
    evaluate = ["--output-root", ROOT, "--date", DATE, "--min-accuracy", "0.1"]
    code, output = _evaluate(gcs_env, *evaluate)
    assert code == 0, output[-3000:]
    assert "pushed True" in output

    files = _objects(bucket, VERSION_PREFIX)
    assert {"saved_model.pb", serving.PUSH_MARKER} <= set(files)
    assert any(name.startswith("variables/variables.data") for name in files)
    # Nothing is left of the staging folder.
    assert all(".tmp-" not in name for name in _objects(bucket, "runs/serving/"))
    push = json.loads(bucket.blob(f"runs/{DATE}/evaluate/push.json").download_as_bytes())
    assert push["path"] == f"{ROOT}/serving/nightly/2026013100" and push["status"] == "pushed"

    # What the store holds is the model: downloaded, it predicts what the Keras model does.
    local = tmp_path / "downloaded"
    for name in files:
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        bucket.blob(VERSION_PREFIX + name).download_to_filename(str(local / name))
    images = np.random.default_rng(0).uniform(0, 255, [8, 28, 28, 1]).astype(np.float32)
    keras_model = tf_keras.models.load_model(run_root / DATE / "train" / "model.keras")
    outputs = tf.saved_model.load(str(local)).signatures["serving_default"](images=images)
    np.testing.assert_allclose(
        outputs["probabilities"].numpy(), keras_model(images).numpy(), atol=1e-5, rtol=0
    )

    # A rerun of the evaluation leaves the pushed version alone.
    bucket.blob(f"runs/{DATE}/evaluate/metrics.json").delete()
    code, output = _evaluate(gcs_env, *evaluate)
    assert code == 0, output[-3000:]
    assert _objects(bucket, VERSION_PREFIX) == files
    push = json.loads(bucket.blob(f"runs/{DATE}/evaluate/push.json").download_as_bytes())
    assert push["status"] == "already pushed"
