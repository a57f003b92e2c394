"""The stages' image: built from the offline base, non-root, pinned, every stage's CLI inside."""

from __future__ import annotations

import ast

import pytest

from tests.docker.conftest import docker_run
from tests.factories import PROJECT_ROOT

pytestmark = pytest.mark.docker


def pinned_versions() -> dict[str, str]:
    pins = {}
    for line in (PROJECT_ROOT / "requirements.lock").read_text().splitlines():
        name, sep, version = line.strip().partition("==")
        if sep:
            pins[name.lower().replace("_", "-")] = version
    return pins


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
