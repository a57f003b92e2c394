"""Worker containers (`train launch --backend docker`) and stage containers (pipeline.runner).

The FullRuns of tests/docker/conftest.py are the runs with and without worker containers
that the first tests compare (in the one with containers a worker's container is killed
mid-epoch); the rest launch their own."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import luigi
import pytest

from contract import layout
from contract.containers import ContainerSettings
from pipeline import runner
from tests import factories
from tests import tiny_full_run as tiny
from tests.docker.conftest import HOLD_AT_STEP, worker_container
from tests.factories import PROJECT_ROOT
from tests.waiting import wait_until

pytestmark = pytest.mark.docker

PER_WORKER = 256
BATCH = 16
SETTINGS = {
    "model": "mlp",
    "epochs": 3,
    "per_worker_batch_size": BATCH,
    "validation_batch_size": 64,
    "save_freq_steps": 5,
    "early_stopping_patience": 0,
    "reduce_lr_patience": 0,
    "collective_timeout_seconds": 60.0,
}


def launch_command(data_dir: str, train_dir: str, **overrides) -> list[str]:
    command = [sys.executable, "-m", "train", "launch", "--data-dir", data_dir]
    command += ["--train-dir", train_dir, "--num-workers", "2"]
    for name, value in {**SETTINGS, **overrides}.items():
        command += [f"--{name.replace('_', '-')}", str(value)]
    return command


def in_containers(command: list[str], stage_image: str, root: pathlib.Path) -> list[str]:
    """The same launch with one container per worker, `root` mounted at its own path."""
    return [*command, "--backend", "docker", "--image", stage_image, "--docker-mount", str(root)]


def call_logged(command: list[str], log_path: pathlib.Path) -> int:
    """Runs a command as a shell or CI would, its output appended to `log_path`."""
    env = os.environ | {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    with open(log_path, "ab") as log:
        return subprocess.call(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT, env=env
        )


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def artefact_names(train_dir: str) -> set[str]:
    """Files the run left, relative; TensorBoard event files by folder (their names hold hosts)."""
    names = set()
    for root, _, files in os.walk(train_dir):
        rel = os.path.relpath(root, train_dir)
        if rel.split(os.sep)[0] == "logs":
            continue
        for name in files:
            if name.startswith("events.out.tfevents."):
                name = "events.out.tfevents.*"
            names.add(os.path.normpath(os.path.join(rel, name)))
    return names


@pytest.fixture(scope="module")
def shard_root(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("docker_training")
    factories.write_shard_set(str(root / "data"), num_workers=2, per_worker=PER_WORKER)
    return root


@pytest.fixture(scope="module")
def local_and_docker_runs(full_runs) -> tuple[str, str]:
    """The train folders of the shared FullRuns (tests/docker/conftest.py): one run's workers
    were local processes, the other's one container each."""
    local, docker = full_runs
    return str(local / "train"), str(docker / "train")


def test_worker_containers_leave_the_same_artefacts_as_local_workers(local_and_docker_runs):
    local_dir, docker_dir = local_and_docker_runs
    assert artefact_names(docker_dir) == artefact_names(local_dir)
    for name in (layout.MODEL_FILE, layout.HISTORY_FILE, layout.TRAIN_CONFIG_FILE):
        assert os.path.isfile(os.path.join(docker_dir, name)), name


def test_worker_containers_train_the_same_run(local_and_docker_runs):
    local_dir, docker_dir = local_and_docker_runs
    local_config = read_json(os.path.join(local_dir, layout.TRAIN_CONFIG_FILE))
    docker_config = read_json(os.path.join(docker_dir, layout.TRAIN_CONFIG_FILE))
    paths = ("data_dir", "train_dir", "output_root")  # each run's own folders
    assert docker_config["train_dir"] == docker_dir
    assert {k: v for k, v in docker_config.items() if k not in paths} == {
        k: v for k, v in local_config.items() if k not in paths
    }
    local_history = read_json(os.path.join(local_dir, layout.HISTORY_FILE))
    docker_history = read_json(os.path.join(docker_dir, layout.HISTORY_FILE))
    assert docker_history["epochs_completed"] == local_history["epochs_completed"]
    assert docker_history["steps_trained_total"] == local_history["steps_trained_total"]
    # Weight initialisation is not seeded, so two local runs differ in their numbers too:
    # compare the shape of the history, not its values.
    assert {k: len(v) for k, v in docker_history["history"].items()} == {
        k: len(v) for k, v in local_history["history"].items()
    }


def test_worker_logs_and_containers_are_cleaned_up(local_and_docker_runs):
    _, docker_dir = local_and_docker_runs
    for index in (0, 1):
        log = pathlib.Path(docker_dir, "logs", f"worker-{index}.log").read_text()
        assert f"=== attempt 0 worker {index}" in log
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=nightly-trainer.train-dir={docker_dir}"],
        capture_output=True,
        text=True,
    )
    assert left.stdout.strip() == ""


def test_killing_a_worker_container_restarts_the_cluster_and_resumes(full_runs):
    """The container FullRun's worker 1 was killed by `docker kill` at step HOLD_AT_STEP
    (tests/docker/conftest.py): the cluster restarted and resumed from the backup before it."""
    local, docker = full_runs
    train_dir = docker / "train"
    output = (docker / "logs" / "train.log").read_text()
    assert "worker 1 died" in output and "restarting the cluster" in output
    assert "=== attempt 1 worker 1" in (train_dir / "logs" / "worker-1.log").read_text()
    history = read_json(str(train_dir / layout.HISTORY_FILE))
    local_history = read_json(str(local / "train" / layout.HISTORY_FILE))
    assert history["attempt"] == 1 and local_history["attempt"] == 0
    assert history["resumed_from_step"] == tiny.SAVE_FREQ_STEPS == HOLD_AT_STEP - 1
    assert history["steps_trained_total"] == local_history["steps_trained_total"] > HOLD_AT_STEP


def test_bad_training_input_is_rejected_before_any_container_starts(stage_image, shard_root):
    train_dir = str(shard_root / "train-bad")
    log = shard_root / "bad.log"
    command = launch_command(str(shard_root / "data"), train_dir, model="nope")
    code = call_logged(in_containers(command, stage_image, shard_root), log)
    assert code == 2, log.read_text()[-3000:]
    assert "error: unknown model 'nope'" in log.read_text()
    assert worker_container(train_dir, 0) == worker_container(train_dir, 1) == ""


def test_killed_launcher_leaves_no_container(stage_image, shard_root):
    """SIGKILL of the launcher: its reaper removes every worker container of that launch."""
    data_dir, train_dir = str(shard_root / "data"), str(shard_root / "train-orphans")
    log = shard_root / "orphans.log"
    command = in_containers(launch_command(data_dir, train_dir, epochs=50), stage_image, shard_root)
    env = os.environ | {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    with open(log, "ab") as out:
        launcher = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT, env=env
        )
    try:
        wait_until(
            lambda: worker_container(train_dir, 0) and worker_container(train_dir, 1),
            timeout=300,
            alive=lambda: launcher.poll() is None,
            failure=lambda: log.read_text()[-3000:],
            interval=0.5,
        )
    finally:
        launcher.kill()
        launcher.wait()
    wait_until(
        lambda: all_containers(train_dir) == "",
        timeout=120,
        failure=lambda: f"containers outlived the killed launcher: {all_containers(train_dir)}",
        interval=0.5,
    )


def all_containers(train_dir: str) -> str:
    """Every container (running or not) of runs in `train_dir`."""
    proc = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=nightly-trainer.train-dir={train_dir}"],
        capture_output=True,
        text=True,
    )
    return proc.stdout.strip()


def test_a_failing_stage_container_fails_the_task_with_its_error(stage_image, shard_root):
    log = shard_root / "evaluate-missing.log"
    command = [sys.executable, "-m", "evaluate", "--output-root", str(shard_root / "none")]
    container = ContainerSettings(stage_image, (str(shard_root),), workdir=str(shard_root))
    with pytest.raises(runner.StageFailed, match=r"^the evaluate stage "):
        runner.run_stage(luigi.Task(), "evaluate", [*command, "--date", "x"], str(log), container)
    assert "$ docker run --rm --init" in log.read_text()


# Stands in for luigi: runs a long stage (`sleep`, run as given by the image) in a container.
RUNNER_STANDIN = """
import sys
import luigi
from contract.containers import ContainerSettings
from pipeline import runner
image, root, log = sys.argv[1:]
settings = ContainerSettings(image, (root,), workdir=root)
runner.run_stage(luigi.Task(), "sleep", [sys.executable, "-m", "sleep", "600"], log, settings)
"""


def stage_containers(stage: str, *flags: str) -> str:
    proc = subprocess.run(
        ["docker", "ps", "-q", *flags, "--filter", f"label=nightly-trainer.stage={stage}"],
        capture_output=True,
        text=True,
    )
    return proc.stdout.strip()


def test_killed_runner_leaves_no_stage_container(stage_image, shard_root):
    """SIGKILL of the process running a stage container (luigi) removes the container too."""
    log = shard_root / "sleep.log"
    standin = subprocess.Popen(
        [sys.executable, "-c", RUNNER_STANDIN, stage_image, str(shard_root), str(log)],
        cwd=PROJECT_ROOT,
    )
    try:
        wait_until(
            lambda: stage_containers("sleep") != "",
            timeout=120,
            alive=lambda: standin.poll() is None,
            failure=lambda: "the stage container never started:\n" + log.read_text()[-2000:],
            interval=0.5,
        )
    finally:
        standin.kill()
        standin.wait()
    wait_until(
        lambda: stage_containers("sleep", "-a") == "",
        timeout=120,
        failure=lambda: f"containers outlived the killed runner: {stage_containers('sleep', '-a')}",
        interval=0.5,
    )
