"""Fixtures of the Docker tests: the engine check and the stages' image, built once per session.

Tests marked `docker` are skipped, with the reason, when `docker info` fails. The image is
built from the offline base (docker/make_base_image.sh, no registry needed); both scripts
reuse what exists (the base image, the rootfs tarball, docker's layer cache), so a rerun
after a code change only redoes the project layer.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

import pytest

from tests.factories import PROJECT_ROOT

IMAGE = os.environ.get("NIGHTLY_TEST_IMAGE", "nightly-trainer:latest")
BASE_IMAGE = os.environ.get("NIGHTLY_TEST_BASE_IMAGE", "nightly-trainer/base:bookworm")
BUILD_TIMEOUT_SECONDS = 1800


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
    """The stages' image, built on the offline base; its name."""
    env = {**os.environ, "BASE_IMAGE": BASE_IMAGE}
    # How long the builds take is for `pytest --durations`, not for a test to time.
    _run_script("make_base_image.sh", BASE_IMAGE, env=env)
    _run_script("build_image.sh", IMAGE, env=env)
    return IMAGE


def docker_run(image: str, *command: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`docker run --rm image command...`, output captured as text."""
    return subprocess.run(
        ["docker", "run", "--rm", image, *command],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
