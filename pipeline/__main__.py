"""`python -m pipeline [TASK] [luigi flags]`: the same as `luigi --module pipeline TASK ...`.

With no task name it runs `FullRun`, so `python -m pipeline --local-scheduler` is the nightly
run. Exit codes follow luigi.cfg's `[retcode]` section, as with the `luigi` command.
"""

from __future__ import annotations

import sys

from luigi.cmdline import luigi_run

DEFAULT_TASK = "FullRun"


def luigi_argv(argv: list[str]) -> list[str]:
    """The `luigi` command line for `python -m pipeline argv...`."""
    if not argv or argv[0].startswith("-"):
        argv = [DEFAULT_TASK, *argv]
    return ["--module", "pipeline", *argv]


def main(argv: list[str] | None = None) -> int:
    """Runs luigi on this package's tasks; exits with luigi's return code."""
    luigi_run(luigi_argv(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
