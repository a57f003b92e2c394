"""FullRun with `[Executor] kind = docker`: every stage in containers, the same run as local.

The two runs are the `full_runs` fixture (tests/docker/conftest.py), which the worker
container tests read too."""

from __future__ import annotations

import json
import pathlib

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.e2e]


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


def test_docker_run_leaves_the_same_files_as_local(full_runs):
    local, docker = full_runs
    assert files(docker) == files(local)
    assert (docker / "evaluate" / "metrics.json").is_file()


def test_every_stage_ran_in_containers(full_runs):
    _, docker = full_runs
    for stage in ("preprocess", "evaluate"):
        log = (docker / "logs" / f"{stage}.log").read_text()
        assert "$ docker run --rm --init" in log and f" {stage} " in log, stage
    train_log = (docker / "logs" / "train.log").read_text()
    assert " -m train launch " in train_log and " --backend docker --image " in train_log
    assert "workers run in containers of " in train_log
    for index in (0, 1):
        worker_log = (docker / "train" / "logs" / f"worker-{index}.log").read_text()
        assert f"=== attempt 0 worker {index} (nightly-trainer-" in worker_log


def test_shard_set_is_identical(full_runs):
    local, docker = full_runs
    local_manifest = read_json(local / "data" / "manifest.json")
    docker_manifest = read_json(docker / "data" / "manifest.json")
    assert [(f["path"], f["sha256"]) for f in docker_manifest["files"]] == [
        (f["path"], f["sha256"]) for f in local_manifest["files"]
    ]


def test_metrics_and_blessing_have_the_same_shape(full_runs):
    local, docker = full_runs
    for name in ("metrics.json", "blessing.json"):
        assert set(read_json(docker / "evaluate" / name)) == set(
            read_json(local / "evaluate" / name)
        ), name
    metrics = read_json(docker / "evaluate" / "metrics.json")
    assert metrics["num_examples"] == read_json(local / "evaluate" / "metrics.json")["num_examples"]
