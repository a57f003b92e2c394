"""The stages' image: built from the offline base, non-root, pinned, every stage's CLI inside."""

from __future__ import annotations

import ast
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


def test_the_venv_holds_exactly_the_lock(stage_image):
    script = (
        "import importlib.metadata as m; "
        "print('\\n'.join(f\"{d.metadata['Name']}=={d.version}\" for d in m.distributions()))"
    )
    proc = docker_run(stage_image, "python", "-c", script)
    assert proc.returncode == 0, proc.stderr
    installed = {
        canonical(name): version
        for name, _, version in (line.partition("==") for line in proc.stdout.split())
    }
    expected = pinned_versions()
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    expected |= {"pip": "26.3", project["name"]: project["version"]}
    assert installed == expected


def test_container_runs_as_the_non_root_trainer_user(stage_image):
    proc = docker_run(stage_image, "id", "-u")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1000"


def test_python_is_the_venv_on_3_11(stage_image):
    proc = docker_run(stage_image, "python", "-c", "import sys; print(sys.prefix, sys.version)")
    assert proc.returncode == 0, proc.stderr
    prefix, version = proc.stdout.split(maxsplit=1)
    assert prefix == "/opt/venv"
    assert version.startswith("3.11.")


def test_image_holds_the_pinned_versions(stage_image):
    names = ["tensorflow-cpu", "tf-keras", "apache-beam", "tensorflow-datasets", "luigi"]
    script = (
        "import importlib.metadata as m, sys; "
        "print('\\n'.join(f'{n}=={m.version(n)}' for n in sys.argv[1:]))"
    )
    proc = docker_run(stage_image, "python", "-c", script, *names)
    assert proc.returncode == 0, proc.stderr
    pins = pinned_versions()
    installed = dict(line.split("==") for line in proc.stdout.split())
    assert installed == {name: pins[name] for name in names}


def test_legacy_keras_is_set(stage_image):
    proc = docker_run(stage_image, "printenv", "TF_USE_LEGACY_KERAS")
    assert proc.stdout.strip() == "1"


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


def test_dev_tools_stay_out_of_the_image(stage_image):
    # requirements-dev.lock (pytest, ruff, mypy) is for make setup only, never the runtime image.
    dev = [
        line.partition("==")[0]
        for line in (PROJECT_ROOT / "requirements-dev.lock").read_text().splitlines()
        if "==" in line
    ]
    script = (
        "import importlib.metadata as m, sys\n"
        "for n in sys.argv[1:]:\n"
        "    try:\n"
        "        print(n, m.version(n))\n"
        "    except m.PackageNotFoundError:\n"
        "        pass\n"
    )
    proc = docker_run(stage_image, "python", "-c", script, *dev)
    assert proc.returncode == 0, proc.stderr
    assert dev and proc.stdout.strip() == ""


def test_tensorflows_cpp_headers_stay_out_of_the_image(stage_image):
    # Headers for compiling custom ops: 13,000 files that every later build step walks.
    # The installed package's folder, found without importing TensorFlow (seconds of CPU).
    script = (
        "import importlib.util, os; "
        "print(os.listdir(importlib.util.find_spec('tensorflow').submodule_search_locations[0]))"
    )
    proc = docker_run(stage_image, "python", "-c", script)
    assert proc.returncode == 0, proc.stderr[-2000:]
    folders = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert "python" in folders and "include" not in folders
