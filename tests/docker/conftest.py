"""Fixtures of the Docker tests: the engine check and the stages' image, built once per session.

Tests marked `docker` are skipped, with the reason, when `docker info` fails. The image is
built from the offline base (docker/make_base_image.sh, no registry needed) by
docker/assemble_image.sh: the Dockerfile's every step, the lock's packages installed outside
Docker's layered build. The scripts reuse what exists (the base image, the rootfs tarball,
docker's layer cache and uv's), so a rerun after a code change redoes the project layer and
the install.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from tests import tiny_full_run as tiny
from tests.factories import PROJECT_ROOT
from tests.waiting import wait_until
from train.cluster import HOLD_ENV, HOLDING

IMAGE = os.environ.get("NIGHTLY_TEST_IMAGE", "nightly-trainer:latest")
BASE_IMAGE = os.environ.get("NIGHTLY_TEST_BASE_IMAGE", "nightly-trainer/base:bookworm")
BUILD_TIMEOUT_SECONDS = 1800
# The date of the FullRuns the Docker tests share.
DATE = tiny.DATE
# The global step where the container FullRun's workers wait for worker 1's container to be
# killed: inside the tiny run's one epoch, after its first backup.
HOLD_AT_STEP = tiny.SAVE_FREQ_STEPS + 1


@functools.cache
def docker_unavailable_reason() -> str | None:
    """Why Docker tests cannot run here, or None when the engine answers."""
    if shutil.which("docker") is None:
        return "the docker command is not installed"
    try:
        proc = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "'docker info' did not answer within 60 s"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"no Docker engine: 'docker info' fails ({last})"
    return None


def pytest_collection_modifyitems(config, items):
    reason = docker_unavailable_reason()
    if reason is None:
        return
    for item in items:
        if "docker" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


def compose_command() -> list[str] | None:
    """`docker compose` (v2) when the plugin is there, else `docker-compose` (v1), else None."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def _run_script(script: str, *args: str, env: dict[str, str]) -> None:
    proc = subprocess.run(
        ["bash", str(PROJECT_ROOT / "docker" / script), *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_SECONDS,
    )
    if proc.returncode != 0:
        pytest.fail(f"docker/{script} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


@pytest.fixture(scope="session")
def stage_image() -> str:
    """The stages' image on the offline base, its name: docker/Dockerfile built by
    docker/build_image.sh with only the build backend locked (IMAGE-recipe), the whole lock
    installed into its files outside Docker's layered build (docker/assemble_image.sh)."""
    env = {**os.environ, "BASE_IMAGE": BASE_IMAGE}
    # How long the builds take is for `pytest --durations`, not for a test to time.
    _run_script("make_base_image.sh", BASE_IMAGE, env=env)
    _run_script("assemble_image.sh", IMAGE, env=env)
    return IMAGE


def recipe_image(image: str) -> str:
    """The image docker/assemble_image.sh built from the Dockerfile on its way to `image`."""
    return f"{image}-recipe"


def docker_run(image: str, *command: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`docker run --rm image command...`, output captured as text."""
    return subprocess.run(
        ["docker", "run", "--rm", image, *command],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def full_run_command(run: tiny.TinyFullRun, output_root: str, *executor_flags: str) -> list[str]:
    """`luigi ... FullRun` of the tiny run's date on its inputs, under another output root."""
    return [
        sys.executable, "-m", "luigi", *tiny.command(output_root, run.stage_flags()),
        *executor_flags,
    ]  # fmt: skip


def worker_container(train_dir: str, index: int) -> str:
    """The running container of worker `index` of the launch in `train_dir` ("" when none)."""
    proc = subprocess.run(
        [
            "docker", "ps", "-q",
            "--filter", f"label=nightly-trainer.train-dir={train_dir}",
            "--filter", f"label=nightly-trainer.worker={index}",
        ],
        capture_output=True,
        text=True,
    )  # fmt: skip
    return proc.stdout.strip()


def _holding(train_dir: pathlib.Path, index: int) -> bool:
    log = train_dir / "logs" / f"worker-{index}.log"
    return log.is_file() and f"{HOLDING} {HOLD_AT_STEP}" in log.read_text(errors="replace")


@pytest.fixture(scope="session")
def full_runs(stage_image, tiny_full_run, tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    """The session's tiny FullRun with local processes (tests/tiny_full_run.py) and one with
    containers (stage containers, and a container per training worker) on its inputs: their
    run folders.

    The container run's workers hold at HOLD_AT_STEP, after the backup of step
    tiny.SAVE_FREQ_STEPS, until worker 1's container is killed by `docker kill`: the launcher
    restarts the cluster, which resumes from that backup and finishes the same run."""
    assert tiny_full_run.result.returncode == 0, tiny_full_run.result.stderr[-4000:]
    root = tmp_path_factory.mktemp("docker_full_run")
    mounts = [str(root), str(tiny_full_run.folder)]
    command = full_run_command(
        tiny_full_run,
        str(root / "docker"),
        "--Executor-kind=docker",
        f"--Docker-image={stage_image}",
        f"--Docker-mounts={json.dumps(mounts)}",
    )
    train_dir = root / "docker" / DATE / "train"
    log = root / "docker-full-run.log"
    with open(log, "wb") as out:
        luigi_run = subprocess.Popen(
            command,
            cwd=PROJECT_ROOT,
            env=tiny.env() | {HOLD_ENV: str(HOLD_AT_STEP)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(
            lambda: _holding(train_dir, 0) and _holding(train_dir, 1),
            timeout=900,
            alive=lambda: luigi_run.poll() is None,
            failure=lambda: log.read_text(errors="replace")[-4000:],
            interval=0.5,
        )
        container = worker_container(str(train_dir), 1)
        assert container, "worker 1's container is not running"
        subprocess.run(["docker", "kill", container], check=True, capture_output=True)
        luigi_run.wait(timeout=900)
    finally:
        if luigi_run.poll() is None:
            luigi_run.kill()
            luigi_run.wait()
    assert luigi_run.returncode == 0, log.read_text(errors="replace")[-4000:]
    return tiny_full_run.run_dir, root / "docker" / DATE
