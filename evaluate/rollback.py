"""Rolling back to an earlier blessed night: the pointer, the served versions and the record.

    python -m pipeline rollback --to 2026-01-29 [--output-root R] [--reason TEXT] [--dry-run]

Under the pointer's lock: the night's model is checked against the sha256 its evaluation
recorded and its dataset against the output root's lineage (a night of another dataset
identity is refused in one line; contract.lineage), `latest.json` is moved to it, every served
version newer than its version is moved out of the served folder into quarantine (not deleted;
evaluate.served) so TF Serving's default policy, the highest version, serves it again, and a
quarantined copy of its own version is moved back when the served folder lacks it. The nights
rolled back past are marked (`<date>/evaluate/rolled_back.json`), so no later step returns to
them on its own; the rollback itself is recorded in `<output_root>/rollbacks/<UTC time>.json`
(who, when, from, to, reason) and in the run ledger. The next night is judged against, and
warm-started from, the model rolled back to.
"""

from __future__ import annotations

import dataclasses
import datetime
import getpass
import logging
import socket
import sys
from collections.abc import Callable
from typing import Any

from contract import atomic, dates, gfile, history, layout, ledger, lineage, pointer, served_target
from contract.messages import EXIT_BAD_INPUT, EXIT_FAILED, StageArgumentParser, error_line
from evaluate import served
from evaluate.config import DEFAULT_MODEL_NAME, SERVING_DIR, check_model_name

logger = logging.getLogger(__name__)

ROLLBACKS_DIR = "rollbacks"
ENTRY_POINT = "rollback"


class RollbackError(Exception):
    """The rollback cannot be done as asked; nothing was changed."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a rollback moves.

    Attributes:
        to: the pointer to the night rolled back to.
        current: the pointer as it was (None when there was none).
        quarantine: the served versions moved out of the served folder, newest first.
        restore: whether the target's own version comes back from quarantine.
        passed_over: the nights rolled back past (blessed nights after the target).
    """

    to: dict[str, Any]
    current: dict[str, Any] | None
    quarantine: list[int]
    restore: bool
    passed_over: list[str]

    def lines(self, prefix: str = "") -> list[str]:
        """What the plan does, a line per move, each starting with `prefix`."""
        before = (
            "nothing"
            if self.current is None
            else (f"{self.current.get('date')} (version {served.pointer_version(self.current)})")
        )
        said = [
            f"{prefix}latest.json: {before} -> {self.to['date']} (version {self.to['version']})"
        ]
        said += [f"{prefix}quarantine: served version {v}" for v in self.quarantine]
        if self.restore:
            said.append(f"{prefix}restore: served version {self.to['version']} from quarantine")
        said += [f"{prefix}mark rolled back: {night}" for night in self.passed_over]
        return said


def plan(output_root: str, export_base: str, model_name: str, to_date: str) -> Plan:
    """Works out a rollback to `to_date` without changing anything.

    Raises:
        RollbackError: the date is in the future, was never blessed or pushed, its model is
            missing or changed, it is of another dataset identity than the output root's
            lineage, or its served version can be found neither in the served folder nor in
            quarantine.
    """
    if dates.parse(to_date) > datetime.datetime.now(datetime.UTC).date():
        raise RollbackError(f"--to {to_date} is in the future: roll back to a night that ran")
    try:
        target = history.night_pointer(output_root, to_date)
    except history.NightError as e:
        raise RollbackError(f"cannot roll back to {to_date}: {e}") from None
    differ = lineage.differences(
        target.get(pointer.IDENTITY_KEY), lineage.recorded_identity(output_root)
    )
    if differ is not None:
        since = (lineage.read(output_root) or {}).get("since")
        raise RollbackError(
            f"cannot roll back to {to_date}: its model is of another dataset than the output "
            f"root's lineage since {since} ({differ}); roll back to a night of this lineage"
        )
    versions = served.served_versions(export_base, model_name)
    restore = target["version"] not in versions
    if restore and not _in_quarantine(export_base, model_name, target):
        raise RollbackError(
            f"cannot roll back to {to_date}: its served version {target['version']} is neither "
            f"in {served.model_dir(export_base, model_name)} nor in quarantine (removed by "
            "retention?); rerun that night's evaluation to push it again"
        )
    later = [d for d in history.run_dates(output_root) if dates.parse(d) > dates.parse(to_date)]
    passed_over = [d for d in later if _blessed(output_root, d)]
    return Plan(
        to=target,
        current=pointer.read(output_root),
        quarantine=sorted((v for v in versions if v > target["version"]), reverse=True),
        restore=restore,
        passed_over=passed_over,
    )


def _blessed(output_root: str, date: str) -> bool:
    path = layout.join(layout.evaluate_dir(output_root, date), layout.BLESSING_FILE)
    return bool(gfile.exists(path) and atomic.read_json(path).get("blessed"))


def _in_quarantine(export_base: str, model_name: str, target: dict[str, Any]) -> bool:
    folder = served.quarantine_dir(export_base, model_name)
    if not gfile.isdir(folder):
        return False
    prefix = f"{target['version']}-"
    return any(name.rstrip("/").startswith(prefix) for name in gfile.listdir(folder))


def carry_out(
    output_root: str, export_base: str, model_name: str, rollback: Plan, reason: str
) -> dict[str, Any]:
    """Does what the plan says; the caller holds the pointer's lock.

    The order keeps what is served consistent at every step: the target's version comes back
    first, then the pointer moves, then newer versions leave the served folder (a crash in
    between leaves versions newer than the pointer's, which the next evaluation or rollback
    quarantines), then the nights are marked and the rollback recorded.

    Returns:
        The rollback's record.
    """
    target = rollback.to
    if rollback.restore and not served.restore(
        export_base, model_name, target["version"], target["model_sha256"]
    ):
        raise RollbackError(
            f"no quarantined copy of version {target['version']} holds {target['date']}'s model"
        )
    pointer.write(output_root, target)
    for version in rollback.quarantine:
        served.quarantine(
            export_base, model_name, version, f"rolled back to {target['date']}: {reason}"
        )
    record = {
        "who": f"{getpass.getuser()}@{socket.gethostname()}",
        "when_utc": datetime.datetime.now(datetime.UTC).isoformat(),
        "from": None if rollback.current is None else rollback.current.get("date"),
        "from_version": None
        if rollback.current is None
        else served.pointer_version(rollback.current),
        "to": target["date"],
        "to_version": target["version"],
        "model_sha256": target["model_sha256"],
        "reason": reason,
        "quarantined_versions": rollback.quarantine,
        "rolled_back_nights": rollback.passed_over,
    }
    for night in rollback.passed_over:
        path = layout.join(layout.evaluate_dir(output_root, night), history.ROLLED_BACK_FILE)
        atomic.write_json_atomic(path, record)
    mark = layout.join(layout.evaluate_dir(output_root, target["date"]), history.ROLLED_BACK_FILE)
    if gfile.exists(mark):
        gfile.remove(mark)  # rolled forward to a night once rolled back past
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    gfile.makedirs(layout.join(output_root, ROLLBACKS_DIR))
    atomic.write_json_atomic(layout.join(output_root, ROLLBACKS_DIR, f"{stamp}.json"), record)
    return record


def _ledger_record(
    to_date: str, started: datetime.datetime, outcome: str, reason: str | None
) -> dict[str, Any]:
    return {
        "date": to_date,
        "entry_point": ENTRY_POINT,
        "started_utc": started.isoformat(),
        "ended_utc": datetime.datetime.now(datetime.UTC).isoformat(),
        "outcome": outcome,
        "stage": None,
        "reason": reason,
        "command": " ".join(sys.argv),
    }


def parse_args(argv: list[str] | None, defaults: dict[str, str]) -> Any:
    parser = StageArgumentParser(
        prog="python -m pipeline rollback",
        description="Serve an earlier blessed night's model again: moves latest.json to it "
        "and newer served versions into quarantine.",
    )
    parser.add_argument("--to", required=True, help="The blessed night to roll back to.")
    served_target.add_flags(parser, defaults, DEFAULT_MODEL_NAME)
    parser.add_argument("--reason", default="not given", help="Why, for the record.")
    parser.add_argument(
        "--dry-run", action="store_true", help="Print what would move; move nothing."
    )
    return parser.parse_args(argv)


Alert = Callable[[str, dict[str, Any]], list[dict[str, Any]]]


def main(
    argv: list[str] | None = None,
    defaults: dict[str, str] | None = None,
    alert: Alert | None = None,
) -> int:
    """The rollback command; exit 0 when done, 2 when refused, 1 when it failed.

    Args:
        argv: the command line after `rollback`.
        defaults: the output root, export base and model name a night uses.
        alert: called with the output root and the rollback's record once it is done; what
            it returns (the alerts sent) goes into the ledger record.
    """
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        args = parse_args(argv, defaults or {})
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
    started = datetime.datetime.now(datetime.UTC)
    root = args.output_root
    export_base = args.export_base or layout.join(root, SERVING_DIR)
    if not history.run_dates(root) and not gfile.exists(pointer.pointer_path(root)):
        print(
            error_line(
                f"{root} is not an output root: it has no dated run folder and no "
                "latest.json; pass --output-root"
            ),
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    try:
        dates.check(args.to, "--to")
        check_model_name(args.model_name)
        with pointer.pointer_lock(root):
            rollback = plan(root, export_base, args.model_name, args.to)
            if args.dry_run:
                print("\n".join(rollback.lines("would move: ")))
                return 0
            record = carry_out(root, export_base, args.model_name, rollback, args.reason)
            served.reconcile(root, export_base, args.model_name)
    except (RollbackError, ValueError) as e:
        print(error_line(str(e)), file=sys.stderr)
        if not args.dry_run and gfile.isdir(root):
            _append_ledger(root, _ledger_record(args.to, started, ledger.REFUSED, str(e)))
        return EXIT_BAD_INPUT
    except Exception as e:  # noqa: BLE001 - one line and the ledger, whatever broke
        reason = f"{type(e).__name__}: {e}"
        print(error_line(f"the rollback failed: {reason}"), file=sys.stderr)
        _append_ledger(root, _ledger_record(args.to, started, ledger.FAILED, reason))
        return EXIT_FAILED
    print("\n".join(rollback.lines()))
    alerts = alert(root, record) if alert is not None else []
    entry = _ledger_record(args.to, started, ledger.SUCCEEDED, None) | {
        "rollback": record,
        "alerts": alerts,
    }
    _append_ledger(root, entry)
    return 0


def _append_ledger(output_root: str, record: dict[str, Any]) -> None:
    try:
        ledger.append(output_root, record)
    except Exception as e:  # noqa: BLE001 - the record is also in rollbacks/
        logger.warning("could not write the rollback to the run ledger: %s", e)
