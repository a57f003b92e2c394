"""FullRun end to end with a gs:// output root, against a local GCS emulator (no cloud).

`tests.gcs_emulator` serves gcp-storage-emulator and the TLS proxy TensorFlow's gs://
filesystem needs; every process started here gets its environment. One FullRun of tiny
Fashion-MNIST with two workers builds `gs://bucket/runs/<date>`; the following tests share it
(they run in file order): a second FullRun does nothing, `--force-stage evaluate` reruns only
Evaluate on the store. In that one FullRun a worker is killed mid-training: the cluster
restarts and resumes from its backup on gs://.
Files are checked through another client (google-cloud-storage, listing the emulator's bucket)
against the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re

import pytest

from contract import storage
from tests import forked, gcs_emulator
from tests.factories import PROJECT_ROOT
from tests.pipeline.test_full_run_e2e import EVALUATE_FILES, Runner, summary
from tests.preprocess.conftest import build_tiny_tfds, tiny_full_run_flags, write_tiny_sources

pytestmark = pytest.mark.e2e

BUCKET = "bucket"
ROOT = f"gs://{BUCKET}/runs"
DATE = "2026-01-31"
# Three epochs with a backup every two steps; worker 1 is killed at its sixth step, inside the
# second epoch.
# The workers of a gs:// run cannot reach the store from their own network namespace.
TRAIN_FLAGS = ("--Train-epochs=3", "--Train-save-freq-steps=2", "--Train-allow-host-network")
KILL_AT_STEP = "1:6"


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """The emulator and its proxy on free loopback ports; yields the clients' environment."""
    with gcs_emulator.running(tmp_path_factory.mktemp("gcs"), BUCKET) as env:
        yield env


class GcsRunner(Runner):
    """Runs the luigi CLI from an empty working folder with the emulator's environment."""

    def __init__(self, gcs_env: dict, workdir: pathlib.Path, *args) -> None:
        super().__init__(*args)
        self.gcs_env = gcs_env
        self.workdir = workdir

    def env(self) -> dict[str, str]:
        return (
            super().env()
            | self.gcs_env
            | {
                "LUIGI_CONFIG_PATH": str(PROJECT_ROOT / "luigi.cfg"),
                storage.STATE_DIR_ENV: str(self.workdir.parent / "state"),
            }
        )

    def run(self, date: str = DATE, *extra: str, env: dict | None = None, **kwargs):
        # Forked from the session's fork server: luigi's own process reads a gs:// root through
        # TensorFlow, whose import it then skips.
        return forked.run(
            self.command(date, *extra, **kwargs),
            cwd=self.workdir,
            env=self.env() | (env or {}),
            timeout=900,
        )


@pytest.fixture(scope="module")
def runner(gcs, tmp_path_factory):
    sources = tmp_path_factory.mktemp("tiny-sources")
    sums = write_tiny_sources(sources)
    tfds_dir = str(tmp_path_factory.mktemp("tfds"))
    build_tiny_tfds(tfds_dir, str(sources), str(sums))
    workdir = tmp_path_factory.mktemp("cwd")
    flags = tiny_full_run_flags(tfds_dir, str(sources), str(sums))
    runner = GcsRunner(gcs, workdir, ROOT, [*flags, *TRAIN_FLAGS])
    return runner


@pytest.fixture(scope="module")
def bucket(gcs):
    """The emulator's bucket through google-cloud-storage: not the client the stages used."""
    from google.cloud import storage as gcs_client

    saved = {k: os.environ.get(k) for k in gcs}
    os.environ.update(gcs)
    yield gcs_client.Client().bucket(BUCKET)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def objects(bucket, prefix: str) -> dict[str, tuple[int, str]]:
    """Object name (below `prefix`) -> (generation, md5), folder markers left out."""
    return {
        blob.name[len(prefix) :]: (blob.generation, blob.md5_hash)
        for blob in bucket.client.list_blobs(bucket, prefix=prefix)
        if not blob.name.endswith("/")
    }


def read_json(bucket, name: str) -> dict:
    return json.loads(bucket.blob(name).download_as_bytes())


@pytest.fixture(scope="module")
def first_run(runner, bucket):
    result = runner.run(env={"TRAIN_FAULT_KILL_AT_STEP": KILL_AT_STEP})
    assert result.returncode == 0, summary(result)
    return result, objects(bucket, f"runs/{DATE}/")


def test_full_run_on_gs_writes_every_artefact_and_the_manifest_holds(runner, bucket, first_run):
    result, files = first_run
    assert "This progress looks :)" in summary(result)
    manifest = read_json(bucket, f"runs/{DATE}/data/manifest.json")
    assert manifest["num_workers"] == 2
    for entry in manifest["files"]:
        data = bucket.blob(f"runs/{DATE}/data/{entry['path']}").download_as_bytes()
        assert len(data) == entry["size_bytes"], entry["path"]
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], entry["path"]
    for name in ("model.keras", "history.json", "config.json"):
        assert f"train/{name}" in files, name
    for name in EVALUATE_FILES:
        assert f"evaluate/{name}" in files, name
    metrics = read_json(bucket, f"runs/{DATE}/evaluate/metrics.json")
    assert metrics["num_examples"] == 100
    assert metrics["model"]["path"] == f"{DATE}/train/model.keras"
    pointer = read_json(bucket, "runs/latest.json")
    assert pointer["model_path"] == f"{DATE}/train/model.keras"
    model = bucket.blob(f"runs/{pointer['model_path']}").download_as_bytes()
    assert hashlib.sha256(model).hexdigest() == pointer["model_sha256"]
    trend_page = bucket.blob("runs/index.html").download_as_text()
    assert DATE in trend_page  # the trend of nights, on the store too
    # Logs reach the store; nothing lands in the working folder (no 'gs:' or 'logs' folder).
    for name in ("logs/preprocess.log", "logs/train.log", "logs/evaluate.log"):
        assert name in files, name
    assert any(name.startswith("logs/luigi-") for name in files)
    assert any(name.startswith("train/logs/worker-") for name in files)
    assert os.listdir(runner.workdir) == []


def test_second_run_on_gs_does_nothing(runner, bucket, first_run):
    _, before = first_run
    result = runner.run()
    assert result.returncode == 0, summary(result)
    text = summary(result)
    assert "were encountered" in text and "ran successfully" not in text
    assert objects(bucket, f"runs/{DATE}/") == before


def test_forcing_evaluate_on_gs_moves_it_aside_on_the_store(runner, bucket, first_run):
    _, before = first_run
    result = runner.run(DATE, "--force-stage=evaluate", "--Evaluate-min-accuracy=0.999")
    assert result.returncode == 0, summary(result)
    ran = summary(result)[summary(result).index("ran successfully") :]
    assert "- 1 Evaluate(" in ran and "Train(" not in ran and "Preprocess(" not in ran
    after = objects(bucket, f"runs/{DATE}/")
    for name, version in before.items():
        if name.startswith(("data/", "train/")):
            assert after[name] == version, name
    (stamp,) = {n.split("/")[1] for n in after if n.startswith("superseded/")}
    old = f"superseded/{stamp}/evaluate"
    assert {f"{old}/{name}" for name in EVALUATE_FILES} <= set(after)
    assert read_json(bucket, f"runs/{DATE}/{old}/blessing.json")["blessed"]
    assert not read_json(bucket, f"runs/{DATE}/evaluate/blessing.json")["blessed"]
    # Not blessed now: with no earlier blessed night, latest.json goes and the served version
    # waits in quarantine, on the store as on a local disk.
    assert not bucket.blob("runs/latest.json").exists()
    names = [blob.name for blob in bucket.list_blobs(prefix="runs/serving/")]
    assert any(name.startswith("runs/serving/nightly.quarantine/") for name in names)
    # (TensorFlow leaves a folder's own placeholder object; no version's files.)
    assert not [name for name in names if re.match(r"runs/serving/nightly/[0-9]+/.", name)]


def test_killed_worker_resumes_from_its_backup_on_gs(bucket, first_run):
    result, _ = first_run
    train_log = bucket.blob(f"runs/{DATE}/logs/train.log").download_as_text()
    assert "worker 1 died" in train_log and "restarting the cluster" in train_log
    # The restart is shown where the user looks too, not only in the stage's log.
    terminal = result.stdout + result.stderr
    assert "[train] worker 1 died (exit code" in terminal
    assert "restarting the cluster (restart 1 of" in terminal
    history = read_json(bucket, f"runs/{DATE}/train/history.json")
    assert history["attempt"] == 1 and history["resumed_from_step"] > 0
    assert history["epochs_completed"] == 3
