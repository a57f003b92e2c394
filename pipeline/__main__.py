"""`python -m pipeline [TASK] [luigi flags]`: the same as `luigi --module pipeline TASK ...`.

With no task name it runs `FullRun`, so `python -m pipeline --local-scheduler` is the nightly
run. Exit codes follow luigi.cfg's `[retcode]` section, as with the `luigi` command.
`python -m pipeline status ...` prints the last nights from the run ledger instead
(`pipeline.status`), `python -m pipeline catch-up ...` reruns the nights that failed or were
missed (`pipeline.catch_up`), `python -m pipeline rollback --to DATE ...` serves an earlier
blessed night's model again (`evaluate.rollback`), and `python -m pipeline gc [--dry-run]`
removes what luigi.cfg's [Retention] lets go (`pipeline.gc`).
"""

from __future__ import annotations

import sys
from typing import Any

import luigi.configuration
from luigi.cmdline import luigi_run

from pipeline import attempts, catch_up, gc, notify, status

DEFAULT_TASK = "FullRun"
STATUS_COMMAND = "status"
CATCH_UP_COMMAND = "catch-up"
ROLLBACK_COMMAND = "rollback"
GC_COMMAND = "gc"


def rollback_defaults() -> dict[str, str]:
    """luigi.cfg's output root, export base and model name, as a night would use them (the
    defaults of `rollback` and `gc`)."""
    config = luigi.configuration.get_config()
    found = {
        "output_root": status.default_output_root(),
        "export_base": config.get("Evaluate", "export_base", None),
        "model_name": config.get("Evaluate", "model_name", None),
    }
    return {key: str(value) for key, value in found.items() if value}


def alert_rollback(output_root: str, record: dict[str, Any]) -> list[dict[str, Any]]:
    """Alerts a rollback through [Notify]; the alerts sent, for the ledger."""
    reason = (
        f"rolled back from {record['from']} to {record['to']} by {record['who']}: "
        f"{record['reason']}"
    )
    return notify.send(output_root, record["to"], notify.ROLLBACK, reason)


def luigi_argv(argv: list[str]) -> list[str]:
    """The `luigi` command line for `python -m pipeline argv...`."""
    if not argv or argv[0].startswith("-"):
        argv = [DEFAULT_TASK, *argv]
    return ["--module", "pipeline", *argv]


def main(argv: list[str] | None = None) -> int:
    """Runs luigi on this package's tasks, or `status`, `catch-up`, `gc` or `rollback`;
    returns the exit status (luigi's return code for a task)."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == [STATUS_COMMAND]:
        return status.main(args[1:])
    if args[:1] == [CATCH_UP_COMMAND]:
        return catch_up.main(args[1:])
    if args[:1] == [GC_COMMAND]:
        return gc.main(args[1:], rollback_defaults())
    if args[:1] == [ROLLBACK_COMMAND]:
        # Only now: the rollback reads served SavedModels' markers through TensorFlow.
        from evaluate import rollback

        return rollback.main(args[1:], rollback_defaults(), alert_rollback)
    try:
        luigi_run(luigi_argv(args))
    finally:
        attempts.finish()  # the attempt's ledger record, before any later run in this process
    return 0


if __name__ == "__main__":
    sys.exit(main())
