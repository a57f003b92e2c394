"""docker/compose.yaml: valid, two workers whose TF_CONFIGs name each other, one shared volume,
and FullRun's stages in FullRun's order, the data gate and evaluate with FullRun's settings."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess

import pytest
import yaml

import evaluate.__main__ as evaluate_command
from pipeline.data_gate_task import DataGate
from pipeline.evaluate_task import Evaluate
from pipeline.stage_task import StageTask
from preprocess import data_gate
from tests.docker.conftest import compose_command
from tests.factories import PROJECT_ROOT

pytestmark = pytest.mark.docker

COMPOSE_FILE = PROJECT_ROOT / "docker" / "compose.yaml"
DOCS_FILE = PROJECT_ROOT / "docs" / "containers.md"
WORKERS = ["worker-0", "worker-1"]
RUN_DATE = "2026-01-31"
# The one-shot services checked against the task FullRun runs, and the stage's own parser.
CHECKED = {
    "data-gate": (DataGate, data_gate.parse_args),
    "evaluate": (Evaluate, evaluate_command.parse_args),
}
DOCUMENTED = re.compile(
    r"docker-compose -f docker/compose\.yaml (?:run --rm|up) ([\w -]+?)\s*(?:#|$)", re.M
)


def compose_config(**env: str) -> subprocess.CompletedProcess:
    command = compose_command()
    if command is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed")
    environ = {k: v for k, v in os.environ.items() if k != "RUN_DATE"} | env
    return subprocess.run(
        [*command, "-f", str(COMPOSE_FILE), "config"],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )


@pytest.fixture(scope="module")
def config() -> dict:
    proc = compose_config(RUN_DATE=RUN_DATE)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def fullrun_stages() -> list[str]:
    """The stages FullRun runs, first to last, from the tasks' own requires()."""
    task = Evaluate(date=datetime.date.fromisoformat(RUN_DATE), output_root="/data/runs")
    names = []
    while isinstance(task, StageTask):
        names.append(task.spec.name)
        task = task.requires()
    return names[::-1]


def test_services_are_the_stages_and_two_workers(config):
    one_shot = [name for name in fullrun_stages() if name != "train"]
    assert one_shot == ["preprocess", "data-gate", "evaluate"]
    assert set(config["services"]) == {*one_shot, *WORKERS}


@pytest.mark.parametrize("path", [COMPOSE_FILE, DOCS_FILE], ids=lambda p: p.name)
def test_documented_commands_run_the_stages_in_fullruns_order(path):
    started = DOCUMENTED.findall(path.read_text())
    # `up worker-0 worker-1` is the train stage.
    stages = ["train" if names.split() == WORKERS else names for names in started]
    assert stages[:4] == fullrun_stages()


@pytest.mark.parametrize("service", CHECKED)
def test_service_runs_the_stage_with_fullruns_settings(config, service):
    task_class, parse = CHECKED[service]
    task = task_class(date=datetime.date.fromisoformat(RUN_DATE), output_root="/data/runs")
    module = list(task.spec.module)
    command = config["services"][service]["command"]
    assert command[: len(module)] == module  # the entrypoint runs `python -m <module>`
    # Read by the stage's own parser, the same settings as the task's (luigi.cfg's included).
    assert parse(command[len(module) :]) == task.stage_config


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
