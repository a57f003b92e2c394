"""`python -m pipeline catch-up`: reruns the nights that failed or were missed, oldest first.

    python -m pipeline catch-up [--output-root R] [--since DATE] [--until DATE] [--dry-run]
                                [-- LUIGI_FLAGS...]

The nights are `python -m pipeline status`'s rows from `--since` (default: the first of
status's last 14 nights) to `--until` (default: today, UTC) that were not evaluated: failed,
refused, missing, or run a stage at a time; a night with an attempt under way is left alone.
Each runs as cron runs a night, `FullRun --local-scheduler` through `python -m pipeline` with
`--date` set to the night (so a night of daily drops reads the window ending on its own date),
in a process of its own, one after the other; the first that exits non-zero stops the rest.
stdout gets one line a night; the nights' own output goes to stderr.

Exit 0 when every night ran to its end (blessed or not) or none needed to, 1 when one failed,
2 (one `error: ...` line) for a bad argument or a folder that is not an output root.
"""

from __future__ import annotations

import datetime
import shlex
import subprocess
import sys
import time
from typing import Any

from contract import dates, gfile
from contract.messages import EXIT_BAD_INPUT, EXIT_FAILED, StageArgumentParser, error_line
from pipeline import status
from pipeline.terminal import format_duration

STDERR = 2  # the nights' own output goes here, so stdout holds one line a night


def night_command(output_root: str, date: str, luigi_flags: list[str]) -> list[str]:
    """The command that runs night `date` as cron runs a night."""
    return [
        sys.executable,
        "-m",
        "pipeline",
        "FullRun",
        "--local-scheduler",
        f"--date={date}",
        f"--output-root={output_root}",
        *luigi_flags,
    ]


def run_night(command: list[str]) -> int:
    """Runs one night's command to its end; returns its exit status."""
    return subprocess.run(command, stdin=subprocess.DEVNULL, stdout=STDERR).returncode


def shown(command: list[str]) -> str:
    """A night's command as a person would type it."""
    return shlex.join(["python", *command[1:]])


def _outcome_now(output_root: str, date: str) -> dict[str, Any] | None:
    day = dates.parse(date)
    rows = status.nights_between(output_root, day, day)
    return rows[0] if rows else None


def catch_up(
    output_root: str,
    nights: list[dict[str, Any]],
    luigi_flags: list[str],
    dry_run: bool = False,
) -> int:
    """Runs `nights` (status rows) in date order, printing a line each; stops at the first
    whose command exits non-zero.

    Returns:
        0 when each ran to its end (or `dry_run`), EXIT_FAILED when one failed.
    """
    for index, row in enumerate(nights):
        date, was = row["date"], row["outcome"]
        command = night_command(output_root, date, luigi_flags)
        if dry_run:
            print(f"{date}  {was}  would run: {shown(command)}", flush=True)
            continue
        started = time.monotonic()
        code = run_night(command)
        took = format_duration(time.monotonic() - started)
        now = _outcome_now(output_root, date) or {"outcome": "?", "stage": None, "reason": None}
        line = f"{date}  {was} -> {now['outcome']}  exit {code} after {took}"
        if code == 0:
            print(line, flush=True)
            continue
        why = f"{now['stage']}: {now['reason']}" if now["stage"] else now["reason"]
        print(f"{line}{f': {why}' if why else ''}", flush=True)
        for left in nights[index + 1 :]:
            print(f"{left['date']}  {left['outcome']}  not run: stopped at {date}", flush=True)
        return EXIT_FAILED
    return 0


def main(argv: list[str] | None = None, today: datetime.date | None = None) -> int:
    """Parses the command line, finds the nights to rerun and runs them; returns the exit
    status."""
    args_ = list(sys.argv[1:] if argv is None else argv)
    luigi_flags: list[str] = []
    if "--" in args_:
        at = args_.index("--")
        args_, luigi_flags = args_[:at], args_[at + 1 :]
    parser = StageArgumentParser(
        prog="python -m pipeline catch-up",
        description="Reruns the nights that failed or were missed, oldest first, each as cron "
        "runs a night; stops at the first that fails. Flags after -- go to every night's luigi "
        "command.",
    )
    parser.add_argument(
        "--output-root", help="the output root; default: luigi.cfg's [Preprocess] output_root"
    )
    parser.add_argument(
        "--since",
        help=f"the first night, YYYY-MM-DD (default: {status.DEFAULT_NIGHTS - 1} days before "
        "--until)",
    )
    parser.add_argument("--until", help="the last night, YYYY-MM-DD (default: today, UTC)")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the nights and their commands; run nothing"
    )
    args = parser.parse_args(args_)
    try:
        until = (
            (today or status.utc_today())
            if args.until is None
            else dates.parse(args.until, "--until")
        )
        since = (
            until - datetime.timedelta(days=status.DEFAULT_NIGHTS - 1)
            if args.since is None
            else dates.parse(args.since, "--since")
        )
    except dates.DateError as e:
        parser.error(str(e))
    if since > until:
        parser.error(f"--since {since} is after --until {until}")
    output_root = args.output_root or status.default_output_root()
    errors: tuple[type[BaseException], ...] = (status.NotAnOutputRoot, *gfile.file_errors())
    try:
        status.check_output_root(output_root)
        nights = status.to_rerun(status.nights_between(output_root, since, until))
    except errors as e:
        print(error_line(str(e)), file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    if not nights:
        print(f"nothing to catch up from {since} to {until}: each night was evaluated or runs")
        return 0
    return catch_up(output_root, nights, luigi_flags, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
