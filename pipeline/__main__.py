"""`python -m pipeline [TASK] [luigi flags]`: the same as `luigi --module pipeline TASK ...`.

With no task name it runs `FullRun`, so `python -m pipeline --local-scheduler` is the nightly
run. Exit codes follow luigi.cfg's `[retcode]` section, as with the `luigi` command.
`python -m pipeline status ...` prints the last nights from the run ledger instead
(`pipeline.status`).
"""

from __future__ import annotations

import sys

from luigi.cmdline import luigi_run

from pipeline import attempts, status

DEFAULT_TASK = "FullRun"
STATUS_COMMAND = "status"


def luigi_argv(argv: list[str]) -> list[str]:
    """The `luigi` command line for `python -m pipeline argv...`."""
    if not argv or argv[0].startswith("-"):
        argv = [DEFAULT_TASK, *argv]
    return ["--module", "pipeline", *argv]


def main(argv: list[str] | None = None) -> int:
    """Runs luigi on this package's tasks, or `status`; exits with luigi's return code."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == [STATUS_COMMAND]:
        return status.main(args[1:])
    try:
        luigi_run(luigi_argv(args))
    finally:
        attempts.finish()  # the attempt's ledger record, before any later run in this process
    return 0


if __name__ == "__main__":
    sys.exit(main())
