"""Which luigi.cfg a run reads, wherever it starts, and the exit codes a failed night needs.

luigi reads `luigi.cfg` from the working folder (and the file `LUIGI_CONFIG_PATH` names). A
night started from another folder (the installed `nightly-trainer`, a cron line without `cd`)
would otherwise run without the project's settings: no blessing thresholds, no dataset
folder, and no `[retcode]`, so a failed night would exit 0. So, when the pipeline is imported:

- `LUIGI_CONFIG_PATH` set: that file, which must exist;
- else `./luigi.cfg`: the working folder's, as luigi reads it;
- else the project's own `luigi.cfg` (beside this package in a checkout): it is read and the
  run moves to the project's folder, so its relative paths (`runs`, `.cache/...`) mean what
  they mean from there, and says so in one line;
- else no configuration: a run (not `--help`) is refused in one line before any work.

Whatever the configuration, `[retcode]` falls back to the codes below, so a failed or refused
night never exits 0.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import luigi.configuration

CONFIG_FILE = "luigi.cfg"
PROJECT_ROOT = Path(__file__).resolve().parent.parent
# luigi's `[retcode]` options and the codes a night exits with (docs/operations.md).
RETCODES = {
    "already_running": 10,
    "missing_data": 20,
    "not_run": 25,
    "task_failed": 30,
    "scheduling_error": 35,
    "unhandled_exception": 40,
}

# Why no configuration was found (None when one was): a run is refused with it.
problem: str | None = None


def locate(cwd: Path, environment: dict[str, str]) -> tuple[Path | None, str | None]:
    """The configuration file to add to luigi's (None when luigi finds it itself), or why
    there is none.

    Returns:
        (file to add and move to its folder, None), (None, None) when luigi reads the right
        file by itself, or (None, the reason there is no usable file).
    """
    named = environment.get("LUIGI_CONFIG_PATH")
    if named:
        if not os.path.isfile(named):
            return None, (
                f"LUIGI_CONFIG_PATH names {named}, which is not a file: point it at the "
                "pipeline's luigi.cfg"
            )
        return None, None
    if (cwd / CONFIG_FILE).is_file():
        return None, None
    project = PROJECT_ROOT / CONFIG_FILE
    if project.is_file():
        return project, None
    return None, (
        f"no {CONFIG_FILE} in {cwd} and LUIGI_CONFIG_PATH is unset: run from the project's "
        "folder, or set LUIGI_CONFIG_PATH to its luigi.cfg"
    )


def load() -> None:
    """Finds the configuration as the module docstring says and fills in `[retcode]`."""
    global problem
    found, problem = locate(Path.cwd(), dict(os.environ))
    config = luigi.configuration.get_config()
    if found is not None:
        config.add_config_path(str(found))
        os.chdir(found.parent)
        print(
            f"reading {found} (none in the working folder); relative paths are from {found.parent}",
            file=sys.stderr,
            flush=True,
        )
    if not config.has_section("retcode"):
        config.add_section("retcode")
    for option, code in RETCODES.items():
        if not config.has_option("retcode", option):
            config.set("retcode", option, str(code))
