"""The checks after every simulated night; each says what it found in one line.

Each check reads what the night left (the run ledger, what is served, the disk, the alerts the
servers received, `status`'s answer) and compares it with what the simulation did and what
that should have led to. They are pure functions of those readings, so a test can hand them a
broken root's.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from contract import ledger
from pipeline import notify, status
from pipeline.simulation import faults
from pipeline.simulation.commands import Attempt
from pipeline.simulation.retention_bound import Occupancy
from pipeline.simulation.servers import Alert

OUTCOME = "outcome"
FAULT = "fault"
SERVED = "served"
SCORES = "scores"
DISK = "disk"
LEDGER = "ledger"
ALERTS = "alerts"
STATUS = "status"
EVALUATED = (ledger.BLESSED, ledger.NOT_BLESSED)
ACCURACY_TOLERANCE = 1e-6
# The exit codes of luigi.cfg's [retcode] a night's ledger outcome goes with.
EXIT_CODES = {0: (*EVALUATED, ledger.SKIPPED_COMPLETE), 30: (ledger.FAILED,), 35: (ledger.REFUSED,)}


@dataclasses.dataclass(frozen=True)
class Check:
    """One check's verdict: its name, whether it held, and what was found."""

    name: str
    ok: bool
    detail: str


def night_records(records: Iterable[Mapping[str, Any]], date: str) -> list[dict[str, Any]]:
    """The ledger's FullRun records of the night `date`."""
    return [dict(r) for r in records if r.get("date") == date and r.get("entry_point") == "FullRun"]


def outcome_of(records: list[dict[str, Any]]) -> tuple[str, str | None]:
    """The night's outcome as `status` reads it (its last attempt's), and that attempt's
    stage; `missing` when it has no record."""
    last = status.last_attempt(records)
    if last is None:
        return status.MISSING, None
    return str(last.get("outcome")), last.get("stage")


def expected_outcome(night_faults: tuple[str, ...]) -> tuple[tuple[str, ...], str | None]:
    """The outcomes a night with these faults may end with, and the stage a failure is in."""
    if faults.MISSED in night_faults:
        return (status.MISSING,), None
    if faults.CORRUPT_DROP in night_faults:
        return (ledger.FAILED,), "Preprocess"
    if faults.DRIFTED_DROP in night_faults:
        return (ledger.FAILED,), "DataGate"
    if faults.WORSE_MODEL in night_faults:
        return (ledger.NOT_BLESSED,), None
    return EVALUATED, None


def outcome(night_faults: tuple[str, ...], records: list[dict[str, Any]]) -> Check:
    """The night ended as its faults should leave it (a fault-free night: evaluated)."""
    found, stage = outcome_of(records)
    allowed, wanted_stage = expected_outcome(night_faults)
    ok = found in allowed and (wanted_stage is None or stage == wanted_stage)
    where = f" in {stage}" if stage else ""
    want = " or ".join(allowed) + (f" in {wanted_stage}" if wanted_stage else "")
    return Check(OUTCOME, ok, f"{found}{where}" if ok else f"{found}{where}, expected {want}")


def fault_landed(problems: list[str]) -> Check:
    """The faults happened as planned (a kill inside its stage, a disk full for the night)."""
    if problems:
        return Check(FAULT, False, "; ".join(problems))
    return Check(FAULT, True, "as planned")


def served(state: Mapping[str, Any]) -> Check:
    """The pointer, the newest served version and the blessed nights are one model."""
    found = list(state.get("problems") or [])
    if found:
        return Check(SERVED, False, "; ".join(found))
    if state.get("version") is None:
        return Check(SERVED, True, "nothing served yet")
    return Check(SERVED, True, f"{state['date']} as version {state['version']}")


def scores(state: Mapping[str, Any]) -> Check:
    """The newest served version loads and scores on the eval set as its metrics.json says."""
    if state.get("version") is None:
        return Check(SCORES, True, "nothing served yet")
    served_accuracy, recorded = state.get("served_accuracy"), state.get("metrics_accuracy")
    if not isinstance(served_accuracy, float) or not isinstance(recorded, (int, float)):
        return Check(SCORES, False, f"no accuracy to compare ({served_accuracy}, {recorded})")
    same_set = state.get("served_examples") == state.get("metrics_examples")
    ok = same_set and abs(served_accuracy - recorded) <= ACCURACY_TOLERANCE
    detail = (
        f"version {state['newest_version']} scores {served_accuracy:.6f} on "
        f"{state.get('served_examples')} examples; metrics.json says {recorded:.6f} on "
        f"{state.get('metrics_examples')}"
    )
    return Check(SCORES, ok, detail)


def disk(occupancy: Occupancy) -> Check:
    """The output root holds no more than [Retention] lets it."""
    if occupancy.violations:
        return Check(DISK, False, "; ".join(occupancy.violations))
    return Check(DISK, True, f"{occupancy.total_bytes} of at most {occupancy.bound_bytes} bytes")


def ledger_records(records: list[dict[str, Any]], attempts: list[Attempt]) -> Check:
    """One record per attempt: one per FullRun (its pid), a SIGKILLed one's read back as ended
    without a record (failed), one per rollback, nothing else; and each record's outcome goes
    with its exit status."""
    problems = []
    runs = [r for r in records if r.get("entry_point") == "FullRun"]
    for attempt in (a for a in attempts if a.entry_point == "FullRun"):
        mine = [r for r in runs if r.get("pid") == attempt.pid and r.get("date") == attempt.date]
        if len(mine) != 1:
            problems.append(f"{len(mine)} records of {attempt.date}'s attempt (pid {attempt.pid})")
            continue
        unended = bool(mine[0].get("ended_without_record"))
        if attempt.killed_in is not None:
            if not unended or mine[0].get("outcome") != ledger.FAILED:
                problems.append(
                    f"the SIGKILLed attempt of {attempt.date} does not read as ended without a "
                    f"record: {mine[0].get('outcome')}"
                )
            continue
        if unended:
            problems.append(
                f"{attempt.date}'s attempt (pid {attempt.pid}) left no record of its end"
            )
            continue
        if mine[0].get("outcome") not in EXIT_CODES.get(attempt.exit_code, ()):
            problems.append(
                f"{attempt.date}'s attempt exited {attempt.exit_code}, its record says "
                f"{mine[0].get('outcome')}"
            )
    ran = sum(1 for a in attempts if a.entry_point == "FullRun")
    if len(runs) != ran:
        problems.append(f"{len(runs)} FullRun records for {ran} attempts")
    rollbacks = sum(1 for a in attempts if a.entry_point == "rollback")
    recorded = sum(1 for r in records if r.get("entry_point") == "rollback")
    if recorded != rollbacks:
        problems.append(f"{recorded} rollback records for {rollbacks} rollbacks")
    others = sorted({str(r.get("entry_point")) for r in records} - {"FullRun", "rollback"})
    if others:
        problems.append(f"records of entry points the simulation never ran: {', '.join(others)}")
    if problems:
        return Check(LEDGER, False, "; ".join(problems))
    return Check(LEDGER, True, f"{len(records)} records for {len(attempts)} attempts")


def alert_for(record: Mapping[str, Any]) -> Alert | None:
    """The alert an attempt's record calls for (None: a blessed night, a no-op rerun)."""
    if record.get("ended_without_record"):
        return None  # a killed attempt is alerted by `status` alone, when it is a night's last
    outcome_ = record.get("outcome")
    date = str(record.get("date"))
    if outcome_ == ledger.FAILED and record.get("stage") == "DataGate":
        return date, notify.DATA_GATE_ANOMALY
    if outcome_ in (ledger.NOT_BLESSED, ledger.FAILED, ledger.REFUSED):
        return date, str(outcome_)
    return None


def alerts(received: Mapping[str, list[Alert]], expected: set[Alert]) -> Check:
    """Every channel got exactly the expected alerts, each once."""
    problems = []
    for channel, got in received.items():
        counts = collections.Counter(got)
        missing = sorted(expected - set(counts))
        extra = sorted(set(counts) - expected)
        twice = sorted(alert for alert, n in counts.items() if n > 1)
        for what, alerts_ in (("missing", missing), ("unexpected", extra), ("repeated", twice)):
            if alerts_:
                problems.append(f"{channel} {what}: {', '.join(' '.join(a) for a in alerts_)}")
    if problems:
        return Check(ALERTS, False, "; ".join(problems))
    return Check(ALERTS, True, f"{len(expected)} alerts on {len(received)} channels")


def status_answer(code: int, document: Mapping[str, Any], date: str, found: str) -> Check:
    """`status`, run the morning after, shows the night as it ended and exits 0 only when it
    was evaluated."""
    rows = document.get("nights") or []
    last = rows[-1] if rows else {}
    wanted = 0 if found in EVALUATED else 1
    ok = code == wanted and last.get("date") == date and last.get("outcome") == found
    detail = f"exit {code}, last row {last.get('date')} {last.get('outcome')}"
    return Check(STATUS, ok, detail if ok else f"{detail}; expected exit {wanted}, {date} {found}")
