"""The commands in README.md and docs/ cannot drift: every one is checked against the code, and
the blocks marked `<!-- test: run -->` are run, at small size, on a made-up output root.

Checked in every shell block and inline command: each `python -m MODULE` names a module that
exists (and its subcommand, for the stages' own `preprocess`/`train` commands), each
`--Section-parameter` names a parameter of that luigi task or config section, each
`make TARGET` a target of the Makefile, each `luigi --module pipeline TASK` a task. Each whole
`luigi --module pipeline ...` command of a block is parsed by luigi, with luigi.cfg, and every
stage it would run checks its settings as it does before scheduling anything.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import luigi
import pytest
from luigi.cmdline_parser import CmdlineParser

import pipeline  # noqa: F401 - registers the tasks and config sections with luigi
from contract.settings import SettingsError
from pipeline.stage_task import StageTask
from tests.factories import PROJECT_ROOT

DOCS = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
RUN_MARK = "<!-- test: run -->"
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.S | re.M)
MODULE = re.compile(r"python3? -m ([A-Za-z_][\w.]*)(?: ([a-z][a-z-]*))?")
PARAMETER = re.compile(r"--([A-Z][A-Za-z]+)-([a-z][a-z0-9-]*)")
MAKE = re.compile(r"(?:^|[\s`(])make ([a-z][a-z-]*)")
TASK = re.compile(r"luigi --module pipeline ([A-Z]\w+)")
# The stages' subcommands, as their parsers name them.
SUBCOMMANDS = {
    "preprocess": {"run", "verify"},
    "train": {"launch", "worker"},
    "pipeline": {
        "status",
        "catch-up",
        "rollback",
        "gc",
        "FullRun",
        "Preprocess",
        "DataGate",
        "Train",
    },
}


def _blocks(path: Path) -> list[str]:
    return [m.group(1) for m in FENCE.finditer(path.read_text())]


def _text(path: Path) -> str:
    return path.read_text()


def _makefile_targets() -> set[str]:
    text = (PROJECT_ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][a-z-]*):", text, re.M))


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_module_a_doc_names_exists(path):
    for module, sub in MODULE.findall(_text(path)):
        module = module.rstrip(".")
        assert importlib.util.find_spec(module) is not None, f"{path.name}: python -m {module}"
        allowed = SUBCOMMANDS.get(module)
        if allowed and sub and sub.replace("-", "").isalpha() and sub not in ("help",):
            assert sub in allowed or sub.startswith("-"), f"{path.name}: python -m {module} {sub}"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_parameter_a_doc_names_exists(path):
    registered = luigi.task_register.Register._get_reg()
    for section, name in PARAMETER.findall(_text(path)):
        assert section in registered, f"{path.name}: --{section}-{name}: no such task or section"
        params = dict(registered[section].get_params())
        assert name.replace("-", "_") in params, f"{path.name}: --{section}-{name}"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_make_target_and_task_a_doc_names_exists(path):
    targets = _makefile_targets()
    registered = luigi.task_register.Register._get_reg()
    for block in _blocks(path):
        for target in MAKE.findall(block):
            assert target in targets, f"{path.name}: make {target}"
        for task in TASK.findall(block):
            assert task in registered, f"{path.name}: luigi --module pipeline {task}"


def _marked_blocks() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        text = _text(path)
        for match in FENCE.finditer(text):
            before = text[: match.start()].rstrip().splitlines()
            if before and before[-1].strip() == RUN_MARK:
                found.append(
                    (f"{path.name}:{text[: match.start()].count(chr(10)) + 1}", match.group(1))
                )
    return found


def _commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comments dropped."""
    joined = block.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(shlex.join(words))
    return commands


@pytest.fixture(scope="module")
def small_root(tmp_path_factory) -> Path:
    """A working folder whose `runs/` holds three blessed, served nights of a tiny model."""
    from tests.docs_root import write_three_nights

    work = tmp_path_factory.mktemp("docs")
    write_three_nights(work / "runs")
    return work


def test_some_blocks_are_marked_to_run():
    assert len(_marked_blocks()) >= 3


@pytest.mark.parametrize("where, block", _marked_blocks(), ids=[w for w, _ in _marked_blocks()])
def test_a_marked_block_runs(where, block, small_root):
    env = os.environ | {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(PROJECT_ROOT),
        "LUIGI_CONFIG_PATH": str(PROJECT_ROOT / "luigi.cfg"),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    for command in _commands(block):
        done = subprocess.run(
            command,
            shell=True,
            cwd=small_root,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, (
            f"{where}: {command}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )


def _luigi_commands() -> list[tuple[str, list[str]]]:
    """Every `luigi --module pipeline ...` command of the docs' blocks, as its words."""
    found = []
    for path in DOCS:
        for block in _blocks(path):
            for line in block.replace("\\\n", " ").splitlines():
                if line.startswith("luigi --module pipeline "):
                    words = shlex.split(line, comments=True)
                    found.append((f"{path.name}: {shlex.join(words)}", words[3:]))
    return found


def _stage_tasks(task: luigi.Task) -> list[luigi.Task]:
    found, todo = [], [task]
    while todo:
        current = todo.pop()
        if isinstance(current, StageTask):
            found.append(current)
        todo.extend(luigi.task.flatten(current.requires()))
    return found


@pytest.mark.parametrize(
    "where, argv", _luigi_commands(), ids=[w.split(": ")[0] for w, _ in _luigi_commands()]
)
def test_every_luigi_command_a_doc_shows_has_settings_every_stage_accepts(where, argv, tmp_path):
    # What luigi checks before it schedules anything, for each stage the command would run:
    # its settings with luigi.cfg's (the label smoothing beside a module's own loss, say).
    # A bucket of the docs' is a local folder here: the settings are under test, not storage.
    argv = [word.replace("gs://BUCKET", str(tmp_path)) for word in argv]
    with CmdlineParser.global_instance(argv) as parser:
        tasks = _stage_tasks(parser.get_task_obj())
        assert tasks, where
        for task in tasks:
            try:
                task.check_parameters()
            except SettingsError as e:
                pytest.fail(f"{where}: {type(task).__name__}: {e}")
