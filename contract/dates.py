"""Run dates: the one form every entry point takes, `YYYY-MM-DD`, and how dates are compared.

A run's date names its folder (`<output_root>/<date>/`) and orders runs (the latest pointer,
the trend page), so only an ISO calendar date is accepted: `2026-01-31`. Python's
`date.fromisoformat` also takes `20260131` and `2026-W05-6`, and luigi's DateParameter takes
`2026-1-31`; all of them are refused here, as are impossible days (`2026-02-30`). Dates are
compared as `datetime.date`, never as text.

    python -m contract.dates 2026-01-31   # exit 0, or the one error line and exit 2
"""

from __future__ import annotations

import datetime
import re
import sys

from contract.messages import EXIT_BAD_INPUT, error_line
from contract.settings import SettingsError

_ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


class DateError(SettingsError):
    """A run date is not an ISO calendar date `YYYY-MM-DD`."""


def parse(text: object, what: str = "date") -> datetime.date:
    """The calendar date `text` names, written exactly `YYYY-MM-DD`.

    Raises:
        DateError: naming `what`, the value and the form it takes.
    """
    if isinstance(text, str) and _ISO_DATE.fullmatch(text):
        try:
            return datetime.date.fromisoformat(text)
        except ValueError:
            pass
    raise DateError(f"{what} must be a calendar date YYYY-MM-DD (e.g. 2026-01-31), got {text!r}")


def check(text: object, what: str = "date") -> str:
    """`text` itself when it is a valid run date (see `parse`).

    Raises:
        DateError: it is not.
    """
    parse(text, what)
    return str(text)


def is_run_date(text: object) -> bool:
    """Whether `text` is a valid run date (a folder name, a pointer's date)."""
    try:
        parse(text)
    except DateError:
        return False
    return True


def is_later(date: object, than: object) -> bool:
    """Whether run date `date` comes after `than`, compared as dates.

    A value that is not a valid run date (a pointer written by hand or by an older version)
    is never later than anything, and everything valid is later than it, so it never holds
    the latest pointer back.
    """
    if not is_run_date(date):
        return False
    if not is_run_date(than):
        return True
    return parse(date) > parse(than)


def main(argv: list[str] | None = None) -> int:
    """Checks one date given on the command line: exit 0, or one error line and exit 2."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(error_line("usage: python -m contract.dates YYYY-MM-DD"), file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        parse(args[0], "run date")
    except DateError as e:
        print(error_line(str(e)), file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
