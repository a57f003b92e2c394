"""FullRun with `[Executor] kind = docker`: every stage in containers, the same run as local."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.factories import PROJECT_ROOT
from tests.preprocess.conftest import build_tiny_tfds, write_tiny_sources

pytestmark = [pytest.mark.docker, pytest.mark.e2e]

DATE = "2026-01-31"


def full_run(root: pathlib.Path, output_root: str, *executor_flags: str):
    command = [
        sys.executable,
        "-m",
        "luigi",
        "--module",
        "pipeline",
        "FullRun",
        "--local-scheduler",
        f"--date={DATE}",
        f"--output-root={output_root}",
        f"--Preprocess-data-dir={root / 'tfds'}",
        f"--Preprocess-manual-dir={root / 'sources'}",
        f"--Preprocess-manual-checksums={root / 'sources.sha256'}",
        "--Preprocess-beam-args=--runner=DirectRunner --direct_num_workers=1",
        "--Train-model=mlp",
        "--Train-epochs=1",
        "--Train-warmup-epochs=0",  # luigi.cfg warms up for 1 epoch
        "--Train-per-worker-batch-size=32",
        "--Evaluate-min-accuracy=0",
        *executor_flags,
    ]
    env = os.environ | {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(
        command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=900
    )


@pytest.fixture(scope="module")
def runs(stage_image, tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    """One FullRun with local processes and one with containers, on the same tiny dataset."""
    root = tmp_path_factory.mktemp("docker_full_run")
    (root / "sources").mkdir()
    sums = write_tiny_sources(root / "sources")
    os.replace(sums, root / "sources.sha256")
    build_tiny_tfds(str(root / "tfds"), str(root / "sources"), str(root / "sources.sha256"))
    local = full_run(root, str(root / "local"), "--Executor-kind=local")
    assert local.returncode == 0, local.stderr[-4000:]
    docker = full_run(
        root,
        str(root / "docker"),
        "--Executor-kind=docker",
        f"--Docker-image={stage_image}",
        f"--Docker-mounts={json.dumps([str(root)])}",
    )
    assert docker.returncode == 0, docker.stderr[-4000:]
    return root / "local" / DATE, root / "docker" / DATE


def files(run_dir: pathlib.Path) -> set[str]:
    """The run's files, relative; logs aside and TensorBoard event files by folder."""
    names = set()
    for path in run_dir.rglob("*"):
        rel = path.relative_to(run_dir)
        if not path.is_file() or rel.parts[0] == "logs":
            continue
        name = "events.out.tfevents.*" if path.name.startswith("events.out.") else path.name
        names.add(str(rel.parent / name))
    return names


def read_json(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def test_docker_run_leaves_the_same_files_as_local(runs):
    local, docker = runs
    assert files(docker) == files(local)
    assert (docker / "evaluate" / "metrics.json").is_file()


def test_every_stage_ran_in_containers(runs):
    _, docker = runs
    for stage in ("preprocess", "evaluate"):
        log = (docker / "logs" / f"{stage}.log").read_text()
        assert "$ docker run --rm --init" in log and f" {stage} " in log, stage
    train_log = (docker / "logs" / "train.log").read_text()
    assert " -m train launch " in train_log and " --backend docker --image " in train_log
    assert "workers run in containers of " in train_log
    for index in (0, 1):
        worker_log = (docker / "train" / "logs" / f"worker-{index}.log").read_text()
        assert f"=== attempt 0 worker {index} (nightly-trainer-" in worker_log


def test_shard_set_is_identical(runs):
    local, docker = runs
    local_manifest = read_json(local / "data" / "manifest.json")
    docker_manifest = read_json(docker / "data" / "manifest.json")
    assert [(f["path"], f["sha256"]) for f in docker_manifest["files"]] == [
        (f["path"], f["sha256"]) for f in local_manifest["files"]
    ]


def test_metrics_and_blessing_have_the_same_shape(runs):
    local, docker = runs
    for name in ("metrics.json", "blessing.json"):
        assert set(read_json(docker / "evaluate" / name)) == set(
            read_json(local / "evaluate" / name)
        ), name
    metrics = read_json(docker / "evaluate" / "metrics.json")
    assert metrics["num_examples"] == read_json(local / "evaluate" / "metrics.json")["num_examples"]
