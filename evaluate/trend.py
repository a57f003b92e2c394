"""The nightly trend page: `<output_root>/index.html`, one row per evaluated night, and its plot.

A night is a `<output_root>/<YYYY-MM-DD>/` folder whose `evaluate/metrics.json` (the evaluate
stage's completion marker) exists. Only the current evaluation lives there: a forced rerun
moves the old one into `<date>/superseded/`, which is never read, so a superseded evaluation is
never shown as current. Rows and plot points go by date, in whatever order nights were
evaluated (backfills included). Every link is relative, so the folder can be moved or copied.
Besides the evaluation, a row shows what the night trained on and from: the shard set's train
examples and, for daily drops, its window's days (`<date>/data/manifest.json`), and the model
its training started from (`<date>/train/history.json`'s warm start).

Every evaluation rewrites the page and `trend.png` (`update_page`), each atomically, under the
latest pointer's lock: two dates evaluated at once each write their metrics.json first and
then regenerate in turn, so the last page written has both rows.
`python -m evaluate.rewrite_trend --output-root runs` rewrites them by hand.
"""

from __future__ import annotations

import dataclasses
import datetime
import html
import logging
import string
from typing import Any

from contract import atomic, dates, gfile, layout, ledger, manifest, pointer
from evaluate import plots, report, report_page

logger = logging.getLogger(__name__)

INDEX_FILE = "index.html"
TREND_PNG = "trend.png"

# (label, file in `<date>/evaluate/`) of each night's links; a file that is not there (a
# night evaluated before report.html existed) gets no link.
_LINKS = (
    ("report", report_page.REPORT_HTML_FILE),
    ("metrics", layout.METRICS_FILE),
    ("verdict", layout.BLESSING_FILE),
    ("confusion matrix", report.CONFUSION_MATRIX_PNG),
    ("training curves", report.TRAINING_CURVES_PNG),
)

_PAGE = string.Template(
    """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Nightly runs</title>
<style>
body { font-family: sans-serif; margin: 2em; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; vertical-align: top; }
td.number { text-align: right; }
td:first-child { white-space: nowrap; }
td ul { margin: 0; padding-left: 1.2em; }
.blessed { color: #1a7f37; } .not-blessed { color: #cf222e; }
.latest { background: #ddf4ff; border-radius: 0.3em; padding: 0 0.3em; }
img { max-width: 100%; }
</style>
</head>
<body>
<h1>Nightly runs</h1>
<p>$summary</p>
<img id="trend" alt="eval accuracy per night, blessed nights marked" src="$trend_png">
<table id="nights">
<thead>
<tr><th>date</th><th>accuracy</th><th>baseline</th><th>loss</th><th>blessed</th><th>why</th>
<th>pushed</th><th>started from</th><th>days</th><th>train examples</th>
<th>training time</th><th>epochs</th><th>workers</th><th>change against baseline</th>
<th>files</th></tr>
</thead>
<tbody>
$rows
</tbody>
</table>
<p>Page written $updated (UTC) by the evaluate stage.</p>
</body>
</html>
"""
)


@dataclasses.dataclass(frozen=True)
class Night:
    """One evaluated night as the page shows it.

    Attributes:
        date: the night, `YYYY-MM-DD`.
        accuracy: eval accuracy, from metrics.json.
        loss: eval loss, from metrics.json.
        blessed: the verdict, from blessing.json.
        reasons: why, in plain language, from blessing.json.
        training_seconds: the chief's training wall time (train/history.json), or None.
        epochs: epochs trained, or None.
        num_workers: training workers, or None.
        links: (label, path relative to the output root) of the night's files.
        latest: whether `latest.json` points at this night.
        baseline_accuracy: the last blessed model's accuracy on this night's eval set (from
            blessing.json), or None when there was none or it could not be scored.
        pushed_version: the serving version pushed that night (push.json), or None.
        started_from: the date of the blessed model the night's training started from, "cold"
            when warm start was asked but started cold, or None when it was off (history.json).
        train_examples: examples in the shard set's train split (manifest.json), or None.
        days_read: for daily drops, the days of the window that had files, or None.
        window_days: for daily drops, the window's length in days, or None.
        comparison: the paired comparison with the baseline (blessing.json `comparison`:
            difference, lower, upper, confidence, p_value, verdict), or None.
    """

    date: str
    accuracy: float
    loss: float
    blessed: bool
    reasons: tuple[str, ...]
    training_seconds: float | None
    epochs: int | None
    num_workers: int | None
    links: tuple[tuple[str, str], ...]
    latest: bool = False
    baseline_accuracy: float | None = None
    pushed_version: int | None = None
    started_from: str | None = None
    train_examples: int | None = None
    days_read: int | None = None
    window_days: int | None = None
    comparison: dict[str, Any] | None = None

    @property
    def interval(self) -> tuple[float, float] | None:
        """The candidate's accuracy range the change interval implies (baseline + ends)."""
        if self.comparison is None or self.baseline_accuracy is None:
            return None
        base = self.baseline_accuracy
        return base + float(self.comparison["lower"]), base + float(self.comparison["upper"])


def _read_optional(path: str) -> dict[str, Any]:
    return atomic.read_json(path) if gfile.exists(path) else {}


def _optional_number(value: Any, kind: type) -> Any:
    return None if value is None else kind(value)


def read_night(output_root: str, date: str, latest_metrics: str | None = None) -> Night | None:
    """The night of `date`, or None when its evaluation is not finished (no metrics.json)."""
    evaluate_dir = layout.evaluate_dir(output_root, date)
    metrics_path = layout.join(evaluate_dir, layout.METRICS_FILE)
    if not gfile.exists(metrics_path):
        return None
    metrics = atomic.read_json(metrics_path)
    verdict = _read_optional(layout.join(evaluate_dir, layout.BLESSING_FILE))
    push = _read_optional(layout.join(evaluate_dir, report.PUSH_FILE))
    baseline = verdict.get("baseline") or {}
    history = _read_optional(layout.join(layout.train_dir(output_root, date), layout.HISTORY_FILE))
    # What the evaluated model's training was, as metrics.json recorded it; the wall time is
    # only in history.json.
    training = history | metrics.get("model", {}).get("training", {})
    shard_set = _read_optional(
        layout.join(layout.data_dir(output_root, date), layout.MANIFEST_FILE)
    )
    drops = shard_set.get(manifest.DROPS_KEY) or {}
    train_split = shard_set.get("splits", {}).get(layout.TRAIN_SPLIT, {})
    links = tuple(
        (label, layout.join(date, "evaluate", name))
        for label, name in _LINKS
        if gfile.exists(layout.join(evaluate_dir, name))
    )
    return Night(
        date=date,
        accuracy=float(metrics["accuracy"]),
        loss=float(metrics["loss"]),
        blessed=bool(verdict.get("blessed", metrics.get("blessed", False))),
        reasons=tuple(str(r) for r in verdict.get("reasons", ["blessing.json is missing"])),
        training_seconds=_optional_number(history.get("wall_time_seconds"), float),
        epochs=_optional_number(training.get("epochs_completed"), int),
        num_workers=_optional_number(training.get("num_workers"), int),
        links=links,
        latest=layout.join(date, "evaluate", layout.METRICS_FILE) == latest_metrics,
        baseline_accuracy=_optional_number(baseline.get("accuracy"), float),
        pushed_version=_optional_number(push.get("version"), int) if push.get("pushed") else None,
        started_from=_started_from(history.get("warm_start")),
        train_examples=_optional_number(train_split.get("num_examples"), int),
        days_read=len(drops["days_read"]) if "days_read" in drops else None,
        window_days=_optional_number(drops.get("window_days"), int),
        comparison=verdict.get("comparison") or None,
    )


def _started_from(warm_start: dict[str, Any] | None) -> str | None:
    """The date of the model a night's training started from, "cold", or None (off)."""
    if not warm_start or warm_start.get("mode", "off") == "off":
        return None
    started_from = warm_start.get("started_from") or {}
    return str(started_from.get("run_date") or "?") if started_from else "cold"


def _latest_metrics(output_root: str) -> str | None:
    """The metrics.json `latest.json` names, relative to the root (None when it names none).

    Compared by path, not by date: after a forced rerun the pointer may still name the
    superseded evaluation of the same date, and then no current row is the latest.
    """
    current = pointer.read(output_root)
    if current is None:
        return None
    metrics = current.get("metrics_path")
    if isinstance(metrics, str) and metrics:
        return pointer.relative(output_root, pointer.resolve(output_root, metrics))
    date = current.get("date")
    return layout.join(str(date), "evaluate", layout.METRICS_FILE) if date else None


def read_nights(output_root: str) -> list[Night]:
    """Every evaluated night under `output_root`, oldest first.

    A night whose files cannot be read (a hand-edited metrics.json, say) is left out with a
    warning rather than keeping every other night off the page.
    """
    if not gfile.isdir(output_root):
        return []
    latest_metrics = _latest_metrics(output_root)
    unreadable: tuple[type[BaseException], ...] = (
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        *gfile.file_errors(),
    )
    nights = []
    # gs:// listings end folder names with '/'; a folder that is no calendar date is no night.
    names = {name.rstrip("/") for name in gfile.listdir(output_root)}
    for date in sorted(filter(dates.is_run_date, names), key=dates.parse):
        try:
            night = read_night(output_root, date, latest_metrics)
        except unreadable as e:
            logger.warning("trend page: leaving out %s, its files are unreadable: %s", date, e)
            continue
        if night is not None:
            nights.append(night)
    return nights


@dataclasses.dataclass(frozen=True)
class Unfinished:
    """A night with no evaluation, as the run ledger tells it: failed, refused, or missing.

    Attributes:
        date: the night.
        outcome: the last attempt's outcome (`failed`, `refused`, ...) or `missing` (no attempt
            recorded, between nights that have one).
        reason: the failing stage and its one-line reason, or why the night is missing.
    """

    date: str
    outcome: str
    reason: str


# Attempts that say nothing of a night's own run.
_NOT_A_NIGHT = ("rollback", "gc")


def read_unfinished(output_root: str, evaluated: set[str]) -> list[Unfinished]:
    """The nights the run ledger knows of that have no evaluation, and the gaps between them.

    Without a ledger (a root written before it existed) there are none.
    """
    records = [
        r
        for r in ledger.read(output_root)
        if r.get("entry_point") not in _NOT_A_NIGHT and dates.is_run_date(r.get("date"))
    ]
    if not records:
        return []
    by_date: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_date.setdefault(str(record["date"]), []).append(record)
    known = sorted(set(by_date) | evaluated, key=dates.parse)
    first, last = dates.parse(known[0]), dates.parse(known[-1])
    found = []
    for offset in range((last - first).days + 1):
        date = (first + datetime.timedelta(days=offset)).isoformat()
        if date in evaluated:
            continue
        attempts = by_date.get(date)
        if not attempts:
            found.append(Unfinished(date, "missing", "no run of this night was recorded"))
            continue
        attempt = max(attempts, key=lambda r: str(r.get("ended_utc") or r.get("started_utc")))
        stage = f"{attempt['stage']}: " if attempt.get("stage") else ""
        found.append(
            Unfinished(date, str(attempt.get("outcome")), f"{stage}{attempt.get('reason') or ''}")
        )
    return found


def _unfinished_row(night: Unfinished) -> str:
    cells = [
        f"<td>{html.escape(night.date)}</td>",
        '<td class="number">–</td>' * 3,
        f'<td><span class="not-blessed">{html.escape(night.outcome)}</span></td>',
        f"<td><ul><li>{html.escape(night.reason)}</li></ul></td>",
        '<td class="number">–</td>' * 9,
    ]
    return f'<tr id="night-{html.escape(night.date)}">{"".join(cells)}</tr>'


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def _optional(value: Any, fmt: str) -> str:
    return "–" if value is None else fmt.format(value)


def _days(night: Night) -> str:
    """The window's days that had files, of its length ("3 of 7"), for daily drops."""
    if night.days_read is None:
        return "–"
    return f"{night.days_read} of {_optional(night.window_days, '{}')}"


def _change(comparison: dict[str, Any] | None) -> str:
    """The paired change against the baseline: difference, interval, p-value and verdict."""
    if not comparison:
        return "–"
    return (
        f"{comparison['difference']:+.4f} [{comparison['lower']:+.4f}, "
        f"{comparison['upper']:+.4f}] {comparison['verdict']}, p = {comparison['p_value']:.3g}"
    )


def _row(night: Night) -> str:
    verdict = '<span class="blessed">yes</span>'
    if not night.blessed:
        verdict = '<span class="not-blessed">no</span>'
    if night.latest:
        verdict += ' <span class="latest" title="latest.json points here">latest</span>'
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in night.reasons)
    links = " · ".join(
        f'<a href="{html.escape(path)}">{html.escape(label)}</a>' for label, path in night.links
    )
    cells = [
        f"<td>{html.escape(night.date)}</td>",
        f'<td class="number">{night.accuracy:.4f}</td>',
        f'<td class="number">{_optional(night.baseline_accuracy, "{:.4f}")}</td>',
        f'<td class="number">{night.loss:.4f}</td>',
        f"<td>{verdict}</td>",
        f"<td><ul>{reasons}</ul></td>",
        f'<td class="number">{_optional(night.pushed_version, "{}")}</td>',
        f"<td>{html.escape(_optional(night.started_from, '{}'))}</td>",
        f'<td class="number">{_days(night)}</td>',
        f'<td class="number">{_optional(night.train_examples, "{:,}")}</td>',
        f'<td class="number">{_duration(night.training_seconds)}</td>',
        f'<td class="number">{"?" if night.epochs is None else night.epochs}</td>',
        f'<td class="number">{"?" if night.num_workers is None else night.num_workers}</td>',
        f"<td>{html.escape(_change(night.comparison))}</td>",
        f"<td>{links}</td>",
    ]
    return f'<tr id="night-{html.escape(night.date)}">{"".join(cells)}</tr>'


def render(
    nights: list[Night], updated: datetime.datetime, unfinished: list[Unfinished] | None = None
) -> str:
    """Renders the trend page for `nights` (oldest first) and the `unfinished` ones from the
    run ledger, each in its date's row; every text is HTML-escaped."""
    unfinished = unfinished or []
    if nights:
        blessed = [n.date for n in nights if n.blessed]
        summary = (
            f"{len(nights)} evaluated night{'s' if len(nights) != 1 else ''}, "
            f"{nights[0].date} to {nights[-1].date}; {len(blessed)} blessed."
        )
    else:
        summary = "No evaluated nights yet."
    if unfinished:
        summary += f" {len(unfinished)} not evaluated (failed, refused or missing)."
    rows = [(n.date, _row(n)) for n in nights] + [(u.date, _unfinished_row(u)) for u in unfinished]
    return _PAGE.substitute(
        summary=html.escape(summary),
        trend_png=TREND_PNG,
        rows="\n".join(row for _, row in sorted(rows, key=lambda r: dates.parse(r[0]))),
        updated=html.escape(updated.strftime("%Y-%m-%d %H:%M:%S")),
    )


def write_page(output_root: str) -> list[Night]:
    """Rewrites `trend.png`, then `index.html`, each atomically; the caller holds the lock.

    Returns:
        The nights on the page, oldest first.
    """
    nights = read_nights(output_root)
    plots.write_trend(
        [n.date for n in nights],
        [n.accuracy for n in nights],
        [n.blessed for n in nights],
        layout.join(output_root, TREND_PNG),
        intervals=[n.interval for n in nights],
    )
    unfinished = read_unfinished(output_root, {n.date for n in nights})
    page = render(nights, datetime.datetime.now(datetime.UTC), unfinished)
    atomic.write_bytes_atomic(layout.join(output_root, INDEX_FILE), page.encode())
    return nights


def update_page(output_root: str) -> list[Night]:
    """`write_page` under the latest pointer's lock (which is not reentrant: don't hold it)."""
    with pointer.pointer_lock(output_root):
        nights = write_page(output_root)
    logger.info("trend page: %s (%d nights)", layout.join(output_root, INDEX_FILE), len(nights))
    return nights
