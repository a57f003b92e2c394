"""luigi.cfg holds the nightly recipe once: only values that differ from the parameters'
defaults, and the container recipes (compose, Kubernetes) pass the same values."""

from __future__ import annotations

import re

import luigi
import pytest
import yaml

from pipeline.config import Docker, Executor
from pipeline.data_gate_task import DataGate
from pipeline.evaluate_task import Evaluate
from pipeline.full_run import FullRun
from pipeline.preprocess_task import Preprocess
from pipeline.train_task import Train
from tests.factories import PROJECT_ROOT
from tests.recipe import luigi_cfg

TASKS: dict[str, type[luigi.Task]] = {
    "Preprocess": Preprocess,
    "Train": Train,
    "Evaluate": Evaluate,
}
SECTIONS = {**TASKS, "DataGate": DataGate, "FullRun": FullRun}
SECTIONS |= {"Executor": Executor, "Docker": Docker}
# The run's folders: each recipe names its own (a container sees other paths than the host).
PATHS = {"data_dir", "train_dir", "output_root", "manual_dir"}


def recipe(section: str) -> dict[str, object]:
    """luigi.cfg's values of a stage task's section, parsed by the task's parameters."""
    params = dict(TASKS[section].get_params())
    return {k: params[k].parse(v) for k, v in luigi_cfg()[section].items() if k not in PATHS}


def flags_of(args: list[str], task: type[luigi.Task]) -> dict[str, object]:
    """A container's `--name=value` flags, parsed by the task's parameters; `${VAR:-x}` is x."""
    params = dict(task.get_params())
    flags = {}
    for arg in args:
        if not arg.startswith("--"):
            continue
        name, _, text = arg[2:].partition("=")
        name = name.replace("-", "_")
        if name not in PATHS and name not in ("date", "num_workers"):
            flags[name] = params[name].parse(re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text))
    return flags


@pytest.mark.parametrize("section", SECTIONS)
def test_luigi_cfg_names_only_parameters_and_values_that_differ(section):
    params = dict(SECTIONS[section].get_params())
    for name, text in luigi_cfg()[section].items():
        assert name in params, f"[{section}] {name} is no parameter of {section}"
        value = params[name].parse(text)
        assert value != params[name]._default, f"[{section}] {name} repeats the default {text}"


def compose_services() -> dict[str, dict]:
    with open(PROJECT_ROOT / "docker" / "compose.yaml") as f:
        return yaml.safe_load(f)["services"]


def test_compose_workers_train_the_recipe():
    for name in ("worker-0", "worker-1"):
        command = compose_services()[name]["command"]
        assert flags_of(command, Train) == recipe("Train"), name


def test_compose_evaluate_blesses_by_the_recipe():
    assert flags_of(compose_services()["evaluate"]["command"], Evaluate) == recipe("Evaluate")


def test_kubernetes_workers_train_the_recipe():
    with open(PROJECT_ROOT / "docker" / "k8s" / "tfjob.yaml") as f:
        documents = {doc["kind"]: doc for doc in yaml.safe_load_all(f)}
    worker = documents["TFJob"]["spec"]["tfReplicaSpecs"]["Worker"]
    (container,) = worker["template"]["spec"]["containers"]
    assert flags_of(container["args"], Train) == recipe("Train")
