"""The project's wheel, built by pip and installed with its published requirements into a clean
venv: one TensorFlow, `pip check` clean, every entry point runs.

This is the published metadata (pyproject.toml), not `make setup`'s `--no-deps` install of the
lock; the lock only constrains versions. It needs PyPI, as `make setup` does.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv
from importlib import metadata
from pathlib import Path

import pytest

from tests.factories import PROJECT_ROOT

pytestmark = pytest.mark.e2e

ENTRY_POINTS = ("nightly-trainer", "nightly-preprocess", "nightly-train", "nightly-evaluate")


def _project_files() -> list[str]:
    """The files a clone has (tracked, or new and not ignored), so no local build litter counts."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        check=True,
    )
    return [name for name in out.stdout.decode().split("\0") if name]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, Path | str]:
    """A fresh venv with the project's wheel (built by pip from a copy of the project) and its
    published requirements installed; pip itself stays in this suite's venv, which reaches
    the fresh one with `pip --python`."""
    root = tmp_path_factory.mktemp("packaging")
    source = root / "src"
    for name in _project_files():
        if (PROJECT_ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(PROJECT_ROOT / name, source / name)
    env_dir = root / "venv"
    # No pip of its own: seeding one (ensurepip) is seconds of CPU that check nothing here.
    venv.create(env_dir, with_pip=False)
    bin_dir = env_dir / "bin"
    env = _fresh_venv_env()
    pip = pip_for(bin_dir)
    # The project's own wheel first, alone: its build log is what setuptools says about this
    # project's metadata, apart from what it says while building a dependency's sdist.
    wheels = root / "wheels"
    build = subprocess.run(
        [*pip, "wheel", "-v", "--no-deps", "--wheel-dir", str(wheels), str(source)],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (wheel,) = wheels.glob("nightly_trainer-*.whl")
    # The lock as constraints: the known-good versions, so the test does not change its verdict
    # when PyPI publishes a new release of some dependency. uv (beside this Python: `make
    # setup` installs it) resolves the wheel's published requirements as pip does and links the
    # wheels from the cache `make setup` filled, in seconds where pip fetches and unpacks them
    # all again; pip's resolver is the fallback. Neither byte-compiles: TensorFlow's thousands
    # of files are none of what is checked here, and the entry points compile what they import.
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv is not None:
        installer = [uv, "pip", "install", "--python", str(bin_dir / "python")]
    else:
        installer = [*pip, "install", "--no-compile"]
    install = subprocess.run(
        [*installer, "--constraint", str(source / "requirements.lock"), str(wheel)],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    return {"bin": bin_dir, "build_log": build.stdout + build.stderr, "env_dir": env_dir}


def pip_for(bin_dir: Path) -> list[str]:
    """This suite's pip, acting on the venv of `bin_dir` (`pip --python`)."""
    python = str(bin_dir / "python")
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", python]


def _run(installed, *argv: str) -> subprocess.CompletedProcess[str]:
    """`argv` with its program from the fresh venv's bin/."""
    return _run_command(installed, [str(installed["bin"] / argv[0]), *argv[1:]])


def _fresh_venv_env() -> dict[str, str]:
    """This environment without what would point a program at this suite's venv or sources."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _run_command(installed, command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=_fresh_venv_env(),
        cwd=installed["env_dir"],
        timeout=600,
    )


def test_pip_check_finds_no_broken_requirement(installed):
    proc = _run_command(installed, [*pip_for(installed["bin"]), "check"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No broken requirements found" in proc.stdout


def test_exactly_one_tensorflow_distribution_is_installed(installed):
    script = (
        "import importlib.metadata as m\n"
        "names = {d.metadata['Name'].lower() for d in m.distributions()}\n"
        "print(' '.join(sorted(n for n in names if n.startswith('tensorflow') and "
        "n not in ('tensorflow-datasets', 'tensorflow-metadata'))))\n"
    )
    proc = _run(installed, "python", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["tensorflow"]


def test_build_prints_no_setuptools_warning(installed):
    log = str(installed["build_log"])
    assert "Building wheel for nightly-trainer" in log
    # setuptools' "byte-compiling is disabled" note is about the build, not the metadata.
    warnings = [
        line
        for line in log.splitlines()
        if re.search(r"warning", line, re.IGNORECASE) and "byte-compiling" not in line
    ]
    assert warnings == []


@pytest.mark.parametrize("script", ENTRY_POINTS)
def test_console_entry_points_run(installed, script):
    proc = _run(installed, script, "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage" in (proc.stdout + proc.stderr).lower()


def test_python_dash_m_pipeline_names_the_full_run(installed):
    proc = _run(installed, "python", "-m", "pipeline", "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--force-stage" in proc.stdout


def test_tensorboard_is_installed_with_the_project():
    # The README's `tensorboard --logdir ...` must work from the project's own venv.
    assert metadata.version("tensorboard") == "2.21.0"
    assert shutil.which("tensorboard", path=str(Path(sys.executable).parent))


def test_luigi_help_lists_every_task_parameter():
    # argparse formats luigi's help with %: a description holding a bare % ('train[:90%]')
    # made `--help-all` a traceback.
    done = subprocess.run(
        [sys.executable, "-m", "luigi", "--module", "pipeline", "FullRun", "--help-all"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "train[:90%]" in " ".join(done.stdout.split())
    for flag in ("--Preprocess-train-split", "--Train-hparams", "--Evaluate-max-regression"):
        assert flag in done.stdout
