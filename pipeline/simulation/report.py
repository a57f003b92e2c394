"""The simulation's table, a Markdown row a night, and `<root>/simulation.md`."""

from __future__ import annotations

import os
import platform

from pipeline.simulation import faults
from pipeline.simulation.config import Settings
from pipeline.simulation.nights import Row
from pipeline.terminal import format_duration, format_size

HEADER = (
    "| night | date | fault | outcome | accuracy | served | disk | bound | alerts | checks |\n"
    "|---:|---|---|---|---:|---|---:|---:|---|---|"
)
REPORT_FILE = "simulation.md"


def row_line(row: Row) -> str:
    """The night's row of the Markdown table."""
    failed = [check.name for check in row.failed]
    cells = (
        str(row.number),
        row.date,
        ", ".join(row.faults) or "-",
        row.outcome,
        "-" if row.accuracy is None else f"{row.accuracy:.4f}",
        "-" if row.served_version is None else str(row.served_version),
        format_size(row.disk_bytes),
        format_size(row.bound_bytes),
        ", ".join(row.alerts) or "-",
        "FAILED: " + ", ".join(failed) if failed else "ok",
    )
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def table(rows: list[Row]) -> str:
    return "\n".join([HEADER, *(row_line(row) for row in rows)])


def machine() -> str:
    """The CPU's model name and how many CPUs this process may use."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                model,
            )
    except OSError:
        pass
    return f"{model}, {len(os.sched_getaffinity(0))} CPUs"


def failures(rows: list[Row]) -> list[str]:
    """One line per failed check: `night N (DATE): CHECK: what was found`."""
    return [
        f"night {row.number} ({row.date}): {check.name}: {check.detail}"
        for row in rows
        for check in row.failed
    ]


def document(settings: Settings, rows: list[Row], disk_note: str, seconds: float) -> str:
    """The whole report: the settings, the table, the notes, the result."""
    dates = settings.dates()
    lines = [
        f"# {settings.nights} nights, simulated",
        "",
        f"- nights: {dates[0]} to {dates[-1]}, each `python -m pipeline FullRun "
        "--local-scheduler --date D` with the simulation's luigi.cfg",
        f"- drops: {settings.per_day} images a day, a {settings.window_days}-day window, "
        f"a fixed {settings.test_examples}-image eval set",
        f"- faults: {faults.describe(settings.plan)}",
        "- stages: "
        + (
            "forked from one warm fork server (TensorFlow and Beam imported once)"
            if settings.fork_server
            else "each a process of its own (`--own-processes`)"
        ),
        f"- disk: {disk_note}",
        f"- machine: {machine()}; wall time {format_duration(seconds)}",
        "",
        table(rows),
        "",
    ]
    notes = [f"- night {row.number}: {'; '.join(row.notes)}" for row in rows if row.notes]
    if notes:
        lines += ["Notes:", "", *notes, ""]
    failed = failures(rows)
    if failed:
        lines += ["Failed checks:", "", *(f"- {line}" for line in failed)]
    elif len(rows) == settings.nights:
        lines.append(f"Every check passed on all {len(rows)} nights.")
    return "\n".join(lines) + "\n"


def write(settings: Settings, rows: list[Row], disk_note: str, seconds: float) -> str:
    """Writes `<root>/simulation.md`; returns its path."""
    path = os.path.join(settings.root, REPORT_FILE)
    with open(path, "w") as f:
        f.write(document(settings, rows, disk_note, seconds))
    return path
