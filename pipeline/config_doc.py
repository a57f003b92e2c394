"""Writes docs/configuration.md from the Luigi parameters' declarations: `make docs`.

`python -m pipeline.config_doc` prints the page; `--output docs/configuration.md` writes it.
A table per task: each parameter's type, default, value in luigi.cfg and description, as the
code declares them (tests/test_config_doc.py fails when the page is not current).
"""

from __future__ import annotations

import argparse
import configparser
import datetime
import re
import sys
from pathlib import Path
from typing import Any

import luigi

from contract import atomic
from pipeline.config import Docker, Executor
from pipeline.data_gate_task import DataGate
from pipeline.evaluate_task import Evaluate
from pipeline.full_run import FullRun
from pipeline.notify import Notify
from pipeline.params import RunTask
from pipeline.preprocess_task import Preprocess
from pipeline.retention_config import Retention
from pipeline.train_task import Train

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LUIGI_CFG = PROJECT_ROOT / "luigi.cfg"
PAGE = PROJECT_ROOT / "docs" / "configuration.md"

SECTIONS: list[tuple[type[luigi.Task], str]] = [
    (FullRun, "The nightly entry point: Preprocess, Train and Evaluate of one date."),
    (Preprocess, "The preprocess stage (`python -m preprocess run`)."),
    (DataGate, "The data gate between Preprocess and Train (`python -m preprocess.data_gate`)."),
    (Train, "The train stage (`python -m train launch`); each setting is also its flag."),
    (Evaluate, "The evaluate stage (`python -m evaluate`)."),
    (Executor, "Where the stages run."),
    (Docker, "How the `docker` executor runs containers."),
    (
        Notify,
        "Alerts of nights that need attention (docs/operations.md, Alerts); e-mail goes "
        "through luigi's own [smtp] and [email] sections.",
    ),
    (
        Retention,
        "What `python -m pipeline gc`, and every FullRun as it ends, removes of the output root "
        "and the served model (docs/operations.md, Retention); an unknown key or a negative "
        "value is refused.",
    ),
]

INTRO = """\
# Configuration

<!-- Written by `make docs` (python -m pipeline.config_doc) from the parameters' declarations:
edit those (the stage's config dataclass or the task), then run `make docs`. -->

Every setting is a parameter of a Luigi task. Its value comes, first found first, from the
command line (`--Train-epochs 2`, or `--epochs 2` for the task luigi was started with), from
the task's section of `luigi.cfg` (`[Train]` `epochs = 2`), and else from its default. A
parameter marked *falls back to [Section] name* reads that option of luigi.cfg when its own
section lacks it, so the stages agree on one value. `luigi.cfg` holds the nightly recipe: only
the values that differ from the defaults (shown in the luigi.cfg column).

Each stage's settings are declared once, on its config (`preprocess.config.PreprocessConfig`,
`train.config.TrainConfig`, `evaluate.config.EvaluateConfig`): the task and the stage's command
line (`python -m train launch --per-worker-batch-size 128`) take the same names, types, choices
and defaults.
"""


def type_name(parameter: luigi.Parameter[Any]) -> str:
    """What a parameter takes, in a few words."""
    optional = "Optional" in type(parameter).__name__
    choices = getattr(parameter, "_choices", None)
    if choices is not None:
        name = "one of " + ", ".join(f"`{c}`" for c in sorted(choices))
    else:
        kinds = [
            (luigi.DateParameter, "date"),
            (luigi.BoolParameter, "bool"),
            (luigi.IntParameter, "int"),
            (luigi.FloatParameter, "float"),
            (luigi.DictParameter, "dict (JSON)"),
            (luigi.ListParameter, "list (JSON)"),
        ]
        name = next((n for kind, n in kinds if isinstance(parameter, kind)), "str")
    return f"{name}, or empty" if optional else name


def default_text(parameter: luigi.Parameter[Any]) -> str:
    default = parameter._default
    if isinstance(parameter, luigi.DateParameter) and default == datetime.date.today():
        return "today"
    if default is None or default is luigi.parameter._no_value:
        return "empty" if default is None else "(required)"
    if default == "":
        return '`""`'
    return f"`{parameter.serialize(default)}`"


def luigi_cfg_text(
    config: configparser.ConfigParser, section: str, name: str, parameter: luigi.Parameter[Any]
) -> str:
    """The value luigi.cfg gives, naming the section it falls back to when that is the one."""
    if config.has_option(section, name):
        return f"`{config.get(section, name)}`" if config.get(section, name) else '`""`'
    fallback = parameter._config_path
    if fallback and config.has_option(fallback["section"], fallback["name"]):
        value = config.get(fallback["section"], fallback["name"])
        return f"`{value}` ([{fallback['section']}])"
    return ""


def cell(text: str) -> str:
    """Text fit for a table cell: one line, its bars and angle brackets escaped."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "\\<")


def table(
    task: type[luigi.Task], config: configparser.ConfigParser, names: list[str] | None
) -> list[str]:
    rows = [
        "| parameter | type | default | luigi.cfg | description |",
        "| --- | --- | --- | --- | --- |",
    ]
    section = task.get_task_family()
    for name, parameter in task.get_params():
        if names is not None and name not in names:
            continue
        # The type column lists the choices: luigi's own " Choices: {...}" (in set order) goes.
        description = re.sub(r"\s*Choices: \{[^}]*\}$", "", parameter.description or "")
        description = description.replace("%%", "%")  # escaped for argparse's help
        fallback = parameter._config_path
        if fallback and f"[{fallback['section']}]" not in description:
            description += f" Falls back to [{fallback['section']}] {fallback['name']}."
        values = (
            f"`{name}`",
            type_name(parameter),
            default_text(parameter),
            luigi_cfg_text(config, section, name, parameter),
            description,
        )
        rows.append("| " + " | ".join(cell(v) for v in values) + " |")
    return rows


def render(luigi_cfg: Path = LUIGI_CFG) -> str:
    """The whole page, from the parameters' declarations and the values in `luigi_cfg`."""
    config = configparser.ConfigParser()
    config.read(luigi_cfg)
    shared = [name for name, _ in RunTask.get_params()]
    lines = [INTRO]
    lines += ["## Every stage task", ""]
    lines += [
        "Preprocess, DataGate, Train, Evaluate and FullRun each take these; the luigi.cfg",
        "column is [Preprocess]'s, which the others fall back to.",
        "",
    ]
    lines += table(Preprocess, config, shared) + [""]
    for task, summary in SECTIONS:
        own = [n for n, _ in task.get_params() if not (issubclass(task, RunTask) and n in shared)]
        lines += [f"## [{task.get_task_family()}]", "", summary, ""]
        lines += table(task, config, own) + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.config_doc", description=__doc__)
    parser.add_argument("--output", help="write the page here (default: print it)")
    parser.add_argument("--luigi-cfg", default=str(LUIGI_CFG), help="the values' file")
    args = parser.parse_args(argv)
    page = render(Path(args.luigi_cfg))
    if args.output:
        atomic.write_bytes_atomic(args.output, page.encode())
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
