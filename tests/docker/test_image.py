"""The stages' image: built from the offline base, non-root, pinned, every stage's CLI inside."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib

import pytest

from tests.docker.conftest import docker_run, recipe_image
from tests.factories import PROJECT_ROOT

pytestmark = pytest.mark.docker


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned_versions() -> dict[str, str]:
    pins = {}
    for line in (PROJECT_ROOT / "requirements.lock").read_text().splitlines():
        name, sep, version = line.partition("#")[0].strip().partition("==")
        if sep:
            pins[canonical(name)] = version
    return pins


def image_config(image: str) -> dict:
    proc = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{json .Config}}", image],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout)


# What docker/Dockerfile's steps leave besides the packages: the user, the owners and modes
# of what the stages use, the project's files and what its install put into the venv.
PROBE = """
id trainer
stat -c '%n %U:%G %a' /data /app /opt/venv /home/trainer /usr/local/bin/nightly-trainer-entrypoint
cd /app && find . | sort
pip --version | cut -d' ' -f1-2
pip show -f nightly-trainer | sed -n '/^Files:/,$p'
"""


def test_the_image_is_the_dockerfiles_recipe_with_the_whole_lock(stage_image):
    # docker/assemble_image.sh builds the Dockerfile with only the build backend locked, then
    # installs the lock outside Docker's build: everything but the packages is the recipe's.
    recipe = recipe_image(stage_image)
    assert image_config(stage_image) == image_config(recipe)
    assembled, built = (docker_run(image, "sh", "-euc", PROBE) for image in (stage_image, recipe))
    assert built.returncode == 0, built.stderr
    assert assembled.returncode == 0, assembled.stderr
    assert assembled.stdout == built.stdout
    assert "uid=1000(trainer) gid=1000(trainer)" in built.stdout
    assert "/data trainer:trainer 755" in built.stdout
    assert "/usr/local/bin/nightly-trainer-entrypoint root:root 755" in built.stdout
    assert "pip 26.3" in built.stdout


# What the other tests read inside the image, from one container: each `docker run` costs
# seconds of a slow VM's CPU on fuse-overlayfs, before the command even starts.
FACTS = """
import importlib.metadata as m, importlib.util, json, os, sys
names = sys.argv[1:]
found = {}
for name in names:
    try:
        found[name] = m.version(name)
    except m.PackageNotFoundError:
        pass
print(json.dumps({
    "uid": os.getuid(),
    "prefix": sys.prefix,
    "version": sys.version,
    "distributions": [f"{d.metadata['Name']}=={d.version}" for d in m.distributions()],
    "versions": found,
    "legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS"),
    # The installed package's folder, found without importing TensorFlow (seconds of CPU).
    "tensorflow_folders": os.listdir(
        importlib.util.find_spec("tensorflow").submodule_search_locations[0]
    ),
}))
"""
PINNED_NAMES = ["tensorflow-cpu", "tf-keras", "apache-beam", "tensorflow-datasets", "luigi"]


def dev_tools() -> list[str]:
    """requirements-dev.lock's packages (pytest, ruff, mypy): for make setup only."""
    return [
        line.partition("==")[0]
        for line in (PROJECT_ROOT / "requirements-dev.lock").read_text().splitlines()
        if "==" in line
    ]


@pytest.fixture(scope="module")
def facts(stage_image) -> dict:
    """FACTS' answers from one container of the image, as its user and environment run it."""
    proc = docker_run(stage_image, "python", "-c", FACTS, *PINNED_NAMES, *dev_tools())
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_venv_holds_exactly_the_lock(facts):
    installed = {
        canonical(name): version
        for name, _, version in (line.partition("==") for line in facts["distributions"])
    }
    expected = pinned_versions()
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    expected |= {"pip": "26.3", project["name"]: project["version"]}
    assert installed == expected


def test_container_runs_as_the_non_root_trainer_user(facts):
    assert facts["uid"] == 1000


def test_python_is_the_venv_on_3_11(facts):
    assert facts["prefix"] == "/opt/venv"
    assert facts["version"].startswith("3.11.")


def test_image_holds_the_pinned_versions(facts):
    pins = pinned_versions()
    installed = {name: facts["versions"].get(name) for name in PINNED_NAMES}
    assert installed == {name: pins[name] for name in PINNED_NAMES}


def test_legacy_keras_is_set(facts):
    assert facts["legacy_keras"] == "1"


@pytest.mark.parametrize(
    ("stage", "usage"),
    [
        ("preprocess", "usage: python -m preprocess"),
        ("train", "usage: python -m train"),
        ("evaluate", "usage: python -m evaluate"),
    ],
)
def test_stage_command_line_runs_in_the_container(stage_image, stage, usage):
    proc = docker_run(stage_image, stage, "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert usage in proc.stdout


def test_train_worker_subcommand_is_there(stage_image):
    proc = docker_run(stage_image, "train", "worker", "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--data-dir" in proc.stdout


def test_dev_tools_stay_out_of_the_image(facts):
    # requirements-dev.lock (pytest, ruff, mypy) is for make setup only, never the runtime image.
    dev = dev_tools()
    found = {name: facts["versions"][name] for name in dev if name in facts["versions"]}
    assert dev and found == {}


def test_tensorflows_cpp_headers_stay_out_of_the_image(facts):
    # Headers for compiling custom ops: 13,000 files that every later build step walks.
    folders = facts["tensorflow_folders"]
    assert "python" in folders and "include" not in folders
