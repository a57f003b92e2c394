"""`python -m pipeline gc`: removes what luigi.cfg's [Retention] lets go of an output root.

    python -m pipeline gc [--output-root R] [--export-base B] [--model-name M] [--dry-run]

Prints one line per thing removed (`removed: <kind> <path> (<why>)`), or with `--dry-run` that
would be (`would remove: ...`, nothing removed). Exit 0 when done, 1 when a removal failed (a
`could not remove ...` line each, on stderr), 2 with one `error: ...` line for bad input: a
folder that is not an output root, an unknown key or a negative value in [Retention]. A run
that removes is recorded in the run ledger (entry point `gc`, no date).
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
from typing import Any

from contract import gfile, ledger, served_target, storage
from contract.messages import EXIT_BAD_INPUT, EXIT_FAILED, StageArgumentParser, error_line
from evaluate.config import DEFAULT_MODEL_NAME, check_model_name
from pipeline import retention, retention_config, status

ENTRY_POINT = "gc"


def parse_args(argv: list[str], defaults: dict[str, str]) -> Any:
    parser = StageArgumentParser(
        prog="python -m pipeline gc",
        description="Remove what luigi.cfg's [Retention] lets go of an output root.",
    )
    served_target.add_flags(
        parser, {"output_root": status.default_output_root(), **defaults}, DEFAULT_MODEL_NAME
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="Print what would be removed; remove nothing."
    )
    return parser.parse_args(argv)


def _check_root(args: Any) -> None:
    """Refuses an output root or export base that cannot be used, or a folder that is not one.

    Raises:
        ValueError: naming the path and what to pass instead.
    """
    storage.check_supported(args.output_root)
    if args.export_base:
        storage.check_supported(args.export_base, "export base")
    status.check_output_root(args.output_root)


def _checked_settings(args: Any) -> retention_config.Settings:
    """[Retention]'s settings, and the model name, checked.

    Raises:
        ValueError: naming the setting and what to give instead.
    """
    check_model_name(args.model_name)
    return retention_config.checked_settings()


def _ledger_record(started: datetime.datetime, outcome: str, **fields: Any) -> dict[str, Any]:
    return {
        "date": None,
        "entry_point": ENTRY_POINT,
        "started_utc": started.isoformat(),
        "ended_utc": datetime.datetime.now(datetime.UTC).isoformat(),
        "outcome": outcome,
        "stage": None,
        "reason": None,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "command": " ".join(sys.argv),
        **fields,
    }


def main(
    argv: list[str] | None = None,
    defaults: dict[str, str] | None = None,
    now: datetime.datetime | None = None,
) -> int:
    """The gc command; returns its exit status.

    Args:
        argv: the command line after `gc`.
        defaults: the output root, export base and model name a night uses.
        now: the time ages are counted to (default: now).
    """
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv, defaults or {})
    except SystemExit as e:  # the parser printed its one line
        return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
    started = datetime.datetime.now(datetime.UTC)
    errors: tuple[type[BaseException], ...] = (ValueError, *gfile.file_errors())
    try:
        _check_root(args)
    except errors as e:
        print(error_line(str(e)), file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    try:
        settings = _checked_settings(args)
    except ValueError as e:
        print(error_line(str(e)), file=sys.stderr, flush=True)
        if not args.dry_run:
            _append_ledger(args.output_root, _ledger_record(started, ledger.REFUSED, reason=str(e)))
        return EXIT_BAD_INPUT
    target = retention.target_of(args.output_root, args.export_base, args.model_name)
    result = retention.run_pass(target, settings, dry_run=args.dry_run, now=now)
    for line in result.lines():
        print(line, flush=True)
    for error in result.errors:
        what = error["path"] or f"anything under {args.output_root}"
        print(f"could not remove {what}: {error['error']}", file=sys.stderr, flush=True)
    outcome = ledger.FAILED if result.errors else ledger.SUCCEEDED
    if not args.dry_run:
        record = _ledger_record(started, outcome, retention=result.record())
        _append_ledger(args.output_root, record)
    return EXIT_FAILED if result.errors else 0


def _append_ledger(output_root: str, record: dict[str, Any]) -> None:
    try:
        ledger.append(output_root, record)
    except Exception as e:  # noqa: BLE001 - what was removed is printed already
        print(f"warning: could not write the run ledger: {e}", file=sys.stderr, flush=True)
