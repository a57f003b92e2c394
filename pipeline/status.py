"""`python -m pipeline status`: the last nights from the run ledger, one row a night.

    python -m pipeline status [--output-root R] [--nights N] [--today DATE] [--json]

The table ends at today (UTC; `--today` names another day, to look at a morning gone by as a
monitor saw it then) or at the newest date in the ledger, whichever is later. A night with an
attempt still under way shows `running`, and one whose attempt was killed shows `failed`
(`contract.ledger`). When nights in the table were not evaluated, a line on stderr names the
`python -m pipeline catch-up` command that reruns them (`pipeline.catch_up`). Exit 0
when its last night was evaluated (blessed or not), 1 when that night failed, was refused, is
missing or still running, 2 (one `error: ...` line) when the folder is not an output root or a
[Notify] setting cannot be used. With exit 1 it also alerts that night through [Notify]
(`pipeline.night_alerts`): a missed night, or a failure whose alert was not delivered yet.
"""

from __future__ import annotations

import datetime
import json
import shlex
import sys
from typing import Any

import luigi.configuration

from contract import atomic, dates, gfile, history, layout, ledger
from contract.messages import EXIT_BAD_INPUT, StageArgumentParser, error_line
from pipeline import night_alerts, notify
from pipeline.terminal import format_duration, format_size

DEFAULT_NIGHTS = 14
MISSING = "missing"
EVALUATED = (ledger.BLESSED, ledger.NOT_BLESSED)
# Attempts that change nothing: a night's row shows them only when nothing else ran.
NO_OP = (ledger.SKIPPED_COMPLETE,)
ROLLBACK_ENTRY_POINT = "rollback"


class NotAnOutputRoot(ValueError):
    """The folder holds no ledger, no latest pointer and no dated run folder."""


def default_output_root() -> str:
    """luigi.cfg's `[Preprocess] output_root`, as the pipeline reads it, else `runs`."""
    return str(luigi.configuration.get_config().get("Preprocess", "output_root", "runs"))


def check_output_root(output_root: str) -> None:
    """Refuses a folder that is not an output root.

    Raises:
        NotAnOutputRoot: naming the folder and what to pass instead.
    """
    if ledger.has_ledger(output_root) or history.run_dates(output_root):
        return
    if gfile.exists(layout.join(output_root, layout.LATEST_POINTER_FILE)):
        return
    raise NotAnOutputRoot(
        f"{output_root} is not an output root: it has no {ledger.LEDGER_FILE}, no "
        f"{layout.LATEST_POINTER_FILE} and no dated run folder; pass --output-root with the "
        "folder luigi.cfg's [Preprocess] output_root names"
    )


def last_attempt(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The night's attempt that ended last, leaving out no-op reruns when anything else ran."""
    # A rollback is an operator's act on the served model, not a run of the night.
    records = [r for r in records if r.get("entry_point") != ROLLBACK_ENTRY_POINT] or records
    ran = [r for r in records if r.get("outcome") not in NO_OP] or records
    return max(ran, key=lambda r: str(r.get("ended_utc") or r["started_utc"]), default=None)


def night(output_root: str, date: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """One night's row: its last attempt and what its folder holds."""
    attempt = last_attempt(records)
    evaluate_dir = layout.evaluate_dir(output_root, date)
    metrics = atomic.read_json_object(layout.join(evaluate_dir, layout.METRICS_FILE))
    blessing = atomic.read_json_object(layout.join(evaluate_dir, layout.BLESSING_FILE))
    push = atomic.read_json_object(layout.join(evaluate_dir, layout.PUSH_FILE))
    comparison = blessing.get("comparison") or {}
    interval = None
    if isinstance(comparison, dict) and {"lower", "upper"} <= comparison.keys():
        interval = [comparison["lower"], comparison["upper"]]
    outcome = MISSING if attempt is None else str(attempt.get("outcome"))
    evaluated = outcome in EVALUATED or (
        outcome in (ledger.SKIPPED_COMPLETE, ledger.SUCCEEDED) and "blessed" in blessing
    )
    return {
        "date": date,
        "outcome": outcome,
        "attempts": len(records),
        "evaluated": evaluated,
        "accuracy": metrics.get("accuracy"),
        "interval": interval,
        "served_version": push.get("version") if push.get("pushed") else None,
        "wall_seconds": None if attempt is None else attempt.get("wall_seconds"),
        "disk_bytes": ledger.folder_bytes(layout.run_dir(output_root, date)),
        "stage": None if attempt is None else attempt.get("stage"),
        "reason": None if attempt is None else attempt.get("reason"),
    }


def _records_by_date(output_root: str) -> dict[str, list[dict[str, Any]]]:
    """The ledger's attempts of each night, those under way included."""
    by_date: dict[str, list[dict[str, Any]]] = {}
    for record in ledger.read(output_root, running=True):
        if dates.is_run_date(record.get("date")):
            by_date.setdefault(record["date"], []).append(record)
    return by_date


def _rows(
    output_root: str,
    by_date: dict[str, list[dict[str, Any]]],
    first: datetime.date,
    last: datetime.date,
) -> list[dict[str, Any]]:
    """A row for each night from `first` to `last`, leaving out those before the ledger's first
    night (all but `last` when the ledger has none)."""
    known = sorted(dates.parse(d) for d in by_date)
    first = max(first, known[0] if known else last)
    count = (last - first).days + 1
    return [
        night(output_root, day.isoformat(), by_date.get(day.isoformat(), []))
        for day in (first + datetime.timedelta(days=n) for n in range(max(0, count)))
    ]


def nights(output_root: str, count: int, today: datetime.date | None = None) -> list[dict]:
    """The last `count` nights, oldest first, ending at today or the newest ledger date.

    Nights before the ledger's first are left out; the last night always has its row.
    """
    by_date = _records_by_date(output_root)
    known = sorted(dates.parse(d) for d in by_date)
    end = max([today or utc_today(), *known[-1:]])
    return _rows(output_root, by_date, end - datetime.timedelta(days=count - 1), end)


def nights_between(output_root: str, first: datetime.date, last: datetime.date) -> list[dict]:
    """The nights from `first` to `last`, oldest first, but those before the ledger's first."""
    return _rows(output_root, _records_by_date(output_root), first, last)


def utc_today() -> datetime.date:
    """Today's date in UTC, where the table ends by default."""
    return datetime.datetime.now(datetime.UTC).date()


def to_rerun(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of nights that were not evaluated and have no attempt under way."""
    return [row for row in rows if not row["evaluated"] and row["outcome"] != ledger.RUNNING]


def catch_up_command(
    rows: list[dict[str, Any]], output_root: str | None, until: datetime.date | None
) -> str | None:
    """The `python -m pipeline catch-up` command that reruns the rows' nights that need it (None
    when none does); `output_root` and `until` are passed on when given."""
    nights_ = to_rerun(rows)
    if not nights_:
        return None
    words = ["python", "-m", "pipeline", "catch-up", "--since", nights_[0]["date"]]
    if until is not None:
        words += ["--until", until.isoformat()]
    if output_root is not None:
        words += ["--output-root", output_root]
    return shlex.join(words)


def catch_up_line(rows: list[dict[str, Any]], command: str) -> str:
    """`2 nights to rerun (2026-01-30 missing, 2026-01-31 failed); in date order: <command>`."""
    nights_ = to_rerun(rows)
    listed = ", ".join(f"{row['date']} {row['outcome']}" for row in nights_)
    count = f"{len(nights_)} night{'s' if len(nights_) != 1 else ''}"
    return f"{count} to rerun ({listed}); in date order: {command}"


def accuracy_text(row: dict[str, Any]) -> str:
    """`0.9123 [-0.004, +0.006]` with the blessing's interval of the change, else `0.9123`."""
    if not isinstance(row["accuracy"], (int, float)):
        return "-"
    text = f"{row['accuracy']:.4f}"
    if row["interval"] is not None:
        lower, upper = row["interval"]
        text += f" [{lower:+.3f}, {upper:+.3f}]"
    return text


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as an aligned text table, a failure's stage and reason at the end of its row."""
    lines = [("date", "outcome", "accuracy", "served", "wall", "disk", "tries", "note")]
    for row in rows:
        note = f"{row['stage']}: {row['reason']}" if row["reason"] else ""
        wall = row["wall_seconds"]
        lines.append(
            (
                row["date"],
                row["outcome"],
                accuracy_text(row),
                "-" if row["served_version"] is None else str(row["served_version"]),
                "-" if wall is None else format_duration(wall),
                format_size(row["disk_bytes"]) if row["disk_bytes"] else "-",
                str(row["attempts"]),
                note,
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]) - 1)]
    return "\n".join(
        "  ".join(
            [*(cell.ljust(w) for cell, w in zip(line, widths, strict=False)), line[-1]]
        ).rstrip()
        for line in lines
    )


def exit_status(rows: list[dict[str, Any]]) -> int:
    """0 when the last night was evaluated, 1 when it failed, was refused, is missing or is
    still running."""
    return 0 if rows and rows[-1]["evaluated"] else 1


def main(argv: list[str] | None = None) -> int:
    """Prints the table (or `--json`); returns the exit status."""
    parser = StageArgumentParser(
        prog="python -m pipeline status", description="The last nights from the run ledger."
    )
    parser.add_argument(
        "--output-root", help="the output root; default: luigi.cfg's [Preprocess] output_root"
    )
    parser.add_argument("--nights", type=int, default=DEFAULT_NIGHTS, help="nights to show")
    parser.add_argument(
        "--today",
        help="the day the table ends at, YYYY-MM-DD (default: today, UTC); the newest ledger "
        "date when that is later",
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.nights < 1:
        parser.error(f"--nights must be at least 1, got {args.nights}")
    try:
        today = None if args.today is None else dates.parse(args.today, "--today")
    except dates.DateError as e:
        parser.error(str(e))
    output_root = args.output_root or default_output_root()
    errors: tuple[type[BaseException], ...] = (
        NotAnOutputRoot,
        notify.NotifySettingsError,
        *gfile.file_errors(),
    )
    try:
        check_output_root(output_root)
        alert_settings = notify.check_settings()
        rows = nights(output_root, args.nights, today)
    except errors as e:
        print(error_line(str(e)), file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    code = exit_status(rows)
    if code != 0 and rows:
        # A missed night, or a failure whose alert was not delivered yet.
        night_alerts.status_alerts(output_root, rows[-1], alert_settings)
    # Past nights as the table shows them: up to its last row when --today looked back.
    until = dates.parse(rows[-1]["date"]) if today is not None and rows else None
    command = catch_up_command(rows, args.output_root, until)
    if args.json:
        document = {"output_root": output_root, "exit_status": code, "nights": rows}
        print(json.dumps(document | {"catch_up": command}, indent=2))
    else:
        print(table(rows))
        if command is not None:  # beside the table, not in it: a script reading it is unchanged
            print(catch_up_line(rows, command), file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
