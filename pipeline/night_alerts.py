"""When a night calls for an alert: an attempt's outcome, a status row, a missed night.

`attempt_alerts` runs in the ledger hook (`pipeline.attempts.finish`), for every entry point's
attempt; `status_alerts` when `python -m pipeline status` exits 1. Both send through
`pipeline.notify.send`, so a night and outcome already delivered is not sent again.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

from contract import atomic, dates, gfile, layout, ledger, manifest, run_lock
from pipeline import notify, terminal

logger = logging.getLogger("luigi-interface")

MISSING = "missing"  # a status row's night without a ledger record


def night_outcome(
    output_root: str, date: str, outcome: str, stage: str | None, reason: str | None
) -> tuple[str, str] | None:
    """What an attempt's (or a status row's) outcome alerts as, and why; None for nothing.

    A failure of the data gate that left unaccepted anomalies is DATA_GATE_ANOMALY; a
    blessed night or a stage that succeeded alone is returned too (`notify.send` drops it
    unless notify_on_success).
    """
    because = f"{stage}: {reason}" if stage and reason else reason or outcome
    if outcome in (ledger.BLESSED, ledger.NOT_BLESSED):
        return outcome, terminal.evaluation_line(layout.evaluate_dir(output_root, date))
    if outcome == ledger.FAILED and stage == "DataGate" and _anomalies_stopped(output_root, date):
        return notify.DATA_GATE_ANOMALY, because
    if outcome in (ledger.FAILED, ledger.REFUSED, ledger.SUCCEEDED):
        return outcome, because
    return None


def _anomalies_stopped(output_root: str, date: str) -> bool:
    """Whether the night's anomalies.json lists anomalies that were not accepted."""
    path = layout.join(layout.data_dir(output_root, date), manifest.ANOMALIES_FILE)
    errors: tuple[type[BaseException], ...] = (*gfile.file_errors(), ValueError)
    try:
        report = atomic.read_json(path)
    except errors:
        return False
    return isinstance(report, dict) and bool(report.get("anomalies")) and not report.get("accepted")


def missed(output_root: str, date: str) -> bool:
    """Whether the night `date` was missed: the ledger has no record of it but has one of an
    earlier night, and no run of it is under way."""
    known = {str(r.get("date")) for r in ledger.read(output_root)}
    nights = sorted(d for d in known if dates.is_run_date(d))
    if not nights or date <= nights[0] or date in known:
        return False
    return not run_lock.in_progress(layout.run_dir(output_root, date))


def missed_reason(output_root: str, date: str, found_by: str) -> str:
    """Why a night counts as missed, and how to run it."""
    return (
        f"no attempt of {date} is in the run ledger of {output_root} ({found_by}); run it with "
        f"`luigi --module pipeline FullRun --local-scheduler --date {date}`"
    )


def attempt_alerts(
    output_root: str, record: Mapping[str, Any], settings: notify.Settings | None = None
) -> list[dict[str, Any]]:
    """Sends what an attempt's ledger record calls for: its night's outcome, and for a FullRun
    the night before when it was missed. Never raises.

    Args:
        output_root: the attempt's output root.
        record: its ledger record (date, entry_point, outcome, stage, reason).
        settings: the channels (default: `notify.current_settings()`).

    Returns:
        The alerts tried, for the record's `alerts`.
    """
    entries: list[dict[str, Any]] = []
    date = str(record.get("date"))
    try:
        settings = notify.current_settings() if settings is None else settings
        if not settings.channels:
            return []
        outcome, stage, reason = (record.get(k) for k in ("outcome", "stage", "reason"))
        alert = night_outcome(output_root, date, str(outcome), stage, reason)
        if alert is not None:
            entries += notify.send(output_root, date, *alert, settings=settings)
        previous = (dates.parse(date) - datetime.timedelta(days=1)).isoformat()
        if record.get("entry_point") == "FullRun" and missed(output_root, previous):
            because = missed_reason(output_root, previous, f"found by the run of {date}")
            entries += notify.send(output_root, previous, notify.MISSED, because, settings=settings)
    except Exception as e:  # noqa: BLE001 - alerting must never fail the night
        logger.warning("could not alert the attempt of %s: %s", date, e)
        entries.append(notify.failed_entry(date, str(record.get("outcome")), str(e)))
    return entries


def status_alerts(
    output_root: str, row: Mapping[str, Any], settings: notify.Settings | None = None
) -> list[dict[str, Any]]:
    """Sends what `python -m pipeline status`'s last night calls for when it exits 1: a
    missed night (unless a run of it is under way), or a failed or refused one whose alert
    was not delivered yet. Never raises.

    Args:
        output_root: the output root status read.
        row: the last night's row (date, outcome, stage, reason).
        settings: the channels (default: `notify.current_settings()`).
    """
    date = str(row["date"])
    try:
        settings = notify.current_settings() if settings is None else settings
        if not settings.channels:
            return []
        if row["outcome"] == MISSING:
            if not missed(output_root, date):
                return []
            because = missed_reason(output_root, date, "found by python -m pipeline status")
            return notify.send(output_root, date, notify.MISSED, because, settings=settings)
        alert = night_outcome(output_root, date, row["outcome"], row["stage"], row["reason"])
        if alert is None or alert[0] in notify.SUCCESSES:
            return []
        return notify.send(output_root, date, *alert, settings=settings)
    except Exception as e:  # noqa: BLE001 - status reports; an alert must not change that
        logger.warning("could not alert %s: %s", date, e)
        return []
