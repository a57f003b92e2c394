"""docker/compose.yaml: valid, two workers whose TF_CONFIGs name each other, one shared volume."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from tests.docker.conftest import compose_command
from tests.factories import PROJECT_ROOT

pytestmark = pytest.mark.docker

COMPOSE_FILE = str(PROJECT_ROOT / "docker" / "compose.yaml")
WORKERS = ["worker-0", "worker-1"]


def compose_config(**env: str) -> subprocess.CompletedProcess:
    command = compose_command()
    if command is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed")
    environ = {k: v for k, v in os.environ.items() if k != "RUN_DATE"} | env
    return subprocess.run(
        [*command, "-f", COMPOSE_FILE, "config"],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )


@pytest.fixture(scope="module")
def config() -> dict:
    proc = compose_config(RUN_DATE="2026-01-31")
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def test_services_are_the_stages_and_two_workers(config):
    assert set(config["services"]) == {"preprocess", "evaluate", *WORKERS}


def test_each_worker_tf_config_names_both_services(config):
    for index, name in enumerate(WORKERS):
        service = config["services"][name]
        tf_config = json.loads(service["environment"]["TF_CONFIG"])
        assert tf_config["cluster"]["worker"] == [f"{w}:2222" for w in WORKERS]
        assert tf_config["task"] == {"type": "worker", "index": index}
        assert service["hostname"] == name
        assert service["command"][:2] == ["train", "worker"]


def test_workers_share_a_private_network_and_restart_on_failure(config):
    assert config["networks"]["cluster"]["internal"] is True
    for name in WORKERS:
        assert list(config["services"][name]["networks"]) == ["cluster"]
        assert config["services"][name]["restart"].startswith("on-failure")


def test_every_service_mounts_the_shared_volume(config):
    for name, service in config["services"].items():
        targets = [
            v if isinstance(v, str) else f"{v['source']}:{v['target']}" for v in service["volumes"]
        ]
        assert any(v.startswith("shared:/data") for v in targets), name


def test_run_date_is_required_and_named():
    proc = compose_config()
    assert proc.returncode != 0
    assert "set RUN_DATE=YYYY-MM-DD" in proc.stderr


def test_every_service_gets_run_date_for_the_entrypoint_to_check(config):
    # docker/entrypoint.sh refuses a RUN_DATE that is not YYYY-MM-DD (tests/test_dates.py).
    for name, service in config["services"].items():
        assert service["environment"]["RUN_DATE"] == "2026-01-31", name
