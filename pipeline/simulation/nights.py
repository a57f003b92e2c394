"""One simulated night after another: its faults injected, its attempts run, then every check."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import time
from typing import Any

from contract import history, layout, ledger, pointer
from pipeline import notify
from pipeline.simulation import checks, commands, config, drops, faults, retention_bound
from pipeline.simulation.checks import Check
from pipeline.simulation.commands import Attempt
from pipeline.simulation.disk import Disk
from pipeline.simulation.inspector import SERVED, Inspector
from pipeline.simulation.servers import Alert, Receivers

# The line a training worker logs as fit starts (train.callbacks' marker).
TRAIN_START = re.compile(r"START initial_epoch=(?P<epoch>\d+) initial_step=(?P<step>\d+)")
NOTE_CHARS = 240  # of a failure's reason, in the report's notes
# The file whose existence says a stage finished, by the stage a kill fault stops.
STAGE_DONE = {
    "Train": ("train", layout.HISTORY_FILE),
    "Evaluate": ("evaluate", layout.METRICS_FILE),
}


@dataclasses.dataclass
class Row:
    """One night as the simulation's table shows it."""

    number: int
    date: str
    faults: tuple[str, ...]
    outcome: str
    accuracy: float | None
    served_version: int | None
    disk_bytes: int
    bound_bytes: int
    alerts: list[str]
    checks: list[Check]
    seconds: float
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [check for check in self.checks if not check.ok]

    @classmethod
    def broken(cls, number: int, date: str, night_faults: tuple[str, ...], error: str) -> Row:
        """The row of a night the simulation could not finish (a hung night, a dead child)."""
        check = Check("simulation", False, error)
        return cls(number, date, night_faults, "-", None, None, 0, 0, [], [check], 0.0)


class Simulation:
    """Runs the nights of `settings` one by one (`night`), keeping what the checks compare."""

    def __init__(
        self, settings: config.Settings, disk: Disk, receivers: Receivers, inspector: Inspector
    ) -> None:
        self.settings = settings
        self.disk = disk
        self.receivers = receivers
        self.inspector = inspector
        self.attempts: list[Attempt] = []
        self.missed: list[str] = []
        self._alerts_seen = 0

    def night(self, number: int, date: str) -> Row:
        """Runs night `number` (its date `date`) with its faults, then checks everything."""
        started = time.monotonic()
        here = self.settings.plan.get(number, ())
        problems: list[str] = []
        words: list[str] = []
        notes: list[str] = []
        with drops.spoilt(self.settings, self.inspector, date, here) as note:
            if note is not None:
                notes.append(note)
            if faults.MISSED in here:
                self.missed.append(date)
                words.append("not run")
            else:
                self._run(date, here, problems, words, notes)
        if faults.ROLLBACK in here:
            self._roll_back(date, problems, words)
        code, document = commands.status(self.settings, date)
        row = self._checked(number, date, here, problems, words, (code, document), started)
        row.notes = notes + self._failures(date)
        return row

    def _failures(self, date: str) -> list[str]:
        """`<stage>: <reason>` of each of the night's attempts that failed or was refused."""
        pids = {a.pid for a in self.attempts if a.date == date and a.entry_point == "FullRun"}
        return [
            f"{r.get('outcome')} in {r.get('stage')}: {str(r.get('reason'))[:NOTE_CHARS]}"
            for r in checks.night_records(ledger.read(self.settings.output_root), date)
            if r.get("pid") in pids and r.get("outcome") in (ledger.FAILED, ledger.REFUSED)
        ]

    def _run(
        self,
        date: str,
        here: tuple[str, ...],
        problems: list[str],
        words: list[str],
        notes: list[str],
    ) -> None:
        kill = next((f for f in here if f in commands.KILL_POINTS), None)
        if kill is not None:
            first = self._full_run(date, kill=kill)
            stage = commands.KILL_POINTS[kill][0]
            if first.killed_in is None:
                problems.append(f"the night ended (exit {first.exit_code}) before {stage} ran")
            elif self._stage_done(date, stage):
                problems.append(f"{stage} had finished when the SIGKILL landed")
            words.append(f"killed in {stage}")
        elif faults.DISK_FULL in here:
            ledger_file = ledger.ledger_path(self.settings.output_root)
            notes.append(self.disk.fill(ledger_file))
            try:
                first = self._full_run(date)
            finally:
                self.disk.free()
            if first.exit_code == 0:
                problems.append("the night completed on a full disk")
            words.append(f"{self._outcome_of(first)} on a full disk")
        extra = config.WORSE_RECIPE if faults.WORSE_MODEL in here else ()
        words.append(self._outcome_of(self._full_run(date, extra=extra)))
        if kill == faults.KILL_TRAIN:
            notes.append(f"the rerun's Train started at {self._train_start(date)}")

    def _full_run(self, date: str, extra: tuple[str, ...] = (), kill: str | None = None) -> Attempt:
        attempt = commands.full_run(self.settings, self.disk, date, extra, kill)
        self.attempts.append(attempt)
        return attempt

    def _outcome_of(self, attempt: Attempt) -> str:
        for record in ledger.read(self.settings.output_root):
            if record.get("pid") == attempt.pid and record.get("date") == attempt.date:
                return str(record.get("outcome"))
        return f"exit {attempt.exit_code}, no record"

    def _train_start(self, date: str) -> str:
        """Where the night's last Train started: `epoch E, step S` (a resume from a backup
        starts past 0)."""
        path = layout.join(layout.logs_dir(self.settings.output_root, date), "train.log")
        found = "an unknown point"
        with open(path, errors="replace") as f:
            for line in f:
                match = TRAIN_START.search(line)
                if match:
                    found = f"epoch {match['epoch']}, step {match['step']}"
        return found

    def _stage_done(self, date: str, stage: str) -> bool:
        folder, name = STAGE_DONE[stage]
        return os.path.exists(
            layout.join(layout.run_dir(self.settings.output_root, date), folder, name)
        )

    def _roll_back(self, date: str, problems: list[str], words: list[str]) -> None:
        root = self.settings.output_root
        current = pointer.read(root)
        target = history.last_blessed_before(root, current["date"]) if current else None
        if target is None:
            problems.append("no blessed night before the served one to roll back to")
            return
        attempt = commands.rollback(self.settings, target["date"], f"simulated, after {date}")
        self.attempts.append(attempt)
        if attempt.exit_code != 0:
            problems.append(f"rollback --to {target['date']} exited {attempt.exit_code}")
        words.append(f"rolled back to {target['date']}")

    def expected_alerts(self, records: list[dict[str, Any]]) -> set[Alert]:
        """What the ledger and the missed nights call for so far."""
        runs = [r for r in records if r.get("entry_point") == "FullRun"]
        expected = {alert for r in runs if (alert := checks.alert_for(r)) is not None}
        expected |= {
            (str(r.get("date")), notify.ROLLBACK)
            for r in records
            if r.get("entry_point") == "rollback" and r.get("outcome") == ledger.SUCCEEDED
        }
        return expected | {(date, notify.MISSED) for date in self.missed}

    def _checked(
        self,
        number: int,
        date: str,
        here: tuple[str, ...],
        problems: list[str],
        words: list[str],
        answer: tuple[int, dict[str, Any]],
        started: float,
    ) -> Row:
        settings = self.settings
        records = ledger.read(settings.output_root)
        mine = checks.night_records(records, date)
        state = self.inspector.ask(
            {
                "op": SERVED,
                "output_root": settings.output_root,
                "export_base": settings.export_base,
                "model_name": config.MODEL_NAME,
                "eval_files": settings.eval_files,
            }
        )
        occupancy = retention_bound.occupancy(
            settings.output_root,
            os.path.join(settings.export_base, config.MODEL_NAME),
            config.RETENTION,
            datetime.datetime.now(datetime.UTC).date(),
        )
        found, _ = checks.outcome_of(mine)
        received = dict(self.receivers.channels())
        results = [
            checks.outcome(here, mine),
            checks.fault_landed(problems),
            checks.served(state),
            checks.scores(state),
            checks.disk(occupancy),
            checks.ledger_records(records, self.attempts),
            checks.alerts(received, self.expected_alerts(records)),
            checks.status_answer(*answer, date, found),
        ]
        new_alerts = received["webhook"][self._alerts_seen :]
        self._alerts_seen += len(new_alerts)
        return Row(
            number=number,
            date=date,
            faults=here,
            outcome=" → ".join(words),
            accuracy=_accuracy(settings.output_root, date),
            served_version=state.get("version"),
            disk_bytes=occupancy.total_bytes,
            bound_bytes=occupancy.bound_bytes,
            alerts=[o if d == date else f"{o} ({d})" for d, o in new_alerts],
            checks=results,
            seconds=time.monotonic() - started,
        )


def _accuracy(output_root: str, date: str) -> float | None:
    path = layout.join(layout.evaluate_dir(output_root, date), layout.METRICS_FILE)
    try:
        with open(path) as f:
            value = json.load(f).get("accuracy")
    except (OSError, ValueError):
        return None
    return float(value) if isinstance(value, (int, float)) else None
