"""What of an output root is past keeping under [Retention], and what never is.

`plan(target, settings, now)` lists the removals; `pipeline.retention` carries them out. Never
listed: what `latest.json` names (the model, the metrics and the evaluate folder holding them,
the served version, wherever they lie, superseded folders included), the newest served version,
anything of a night that has not finished (no `<date>/evaluate/metrics.json`) or whose date
another process holds (`run_lock.in_progress`), and what retention has no rule for: logs,
evaluate folders, the ledger, `rollbacks/`, the trend page.
"""

from __future__ import annotations

import dataclasses
import datetime
import os

from contract import atomic, dates, gfile, history, layout, manifest, pointer, run_lock, storage
from pipeline.retention_config import Settings
from pipeline.supersede import STAMP_FORMAT, SUPERSEDED_DIR

SHARD_SET = "shard-set"
CHECKPOINT = "checkpoint"
BACKUP = "backup"
BLESSED_MODEL = "blessed-model"
NOT_BLESSED_MODEL = "not-blessed-model"
SUPERSEDED = "superseded"
SERVED_VERSION = "served-version"
QUARANTINED_VERSION = "quarantined-version"
VERSION_KINDS = (SERVED_VERSION, QUARANTINED_VERSION)
# A SavedModel version loses its push marker's folder and its graph first: what a removal cut
# short leaves is never taken for a model to serve or to restore.
SAVED_MODEL_FIRST = ("assets.extra", "saved_model.pb")
# A shard set loses the data gate's verdict and its manifest first: what is left looks unmade.
SHARD_SET_FIRST = (manifest.DATA_GATE_FILE, layout.MANIFEST_FILE)
QUARANTINE_STAMP_FORMAT = "%Y%m%dT%H%M%S%fZ"  # `<version>-<stamp>`, read when no note says when


@dataclasses.dataclass(frozen=True)
class Target:
    """The output root and the served model whose outputs retention looks after."""

    output_root: str
    export_base: str
    model_name: str

    @property
    def served_dir(self) -> str:
        return layout.join(self.export_base, self.model_name)

    @property
    def quarantine_dir(self) -> str:
        return layout.join(self.export_base, self.model_name + layout.QUARANTINE_SUFFIX)


@dataclasses.dataclass(frozen=True)
class Removal:
    """One file or folder past keeping; `first` names what inside it goes before the rest."""

    kind: str
    path: str
    reason: str
    first: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Night:
    """What retention reads of one dated run folder."""

    date: str
    settled: bool  # evaluated, and no other process holds its date
    blessed: bool | None  # None: no model left to judge, or a verdict that cannot be read
    entries: frozenset[str]
    train_entries: frozenset[str]


@dataclasses.dataclass(frozen=True)
class Protected:
    """What no removal touches: paths (and folders holding them) and served versions."""

    paths: tuple[str, ...]
    versions: frozenset[int]
    version_dates: frozenset[str]  # every version of these dates

    def holds(self, removal: Removal) -> bool:
        """Whether the removal would take a protected path or version."""
        mine = _comparable(removal.path)
        for kept in self.paths:
            if kept == mine or kept.startswith(mine + "/") or mine.startswith(kept + "/"):
                return True
        if removal.kind not in VERSION_KINDS:
            return False
        version = int(os.path.basename(mine).partition("-")[0])
        return version in self.versions or layout.date_of_version(version) in self.version_dates


def _comparable(path: str) -> str:
    path = path.rstrip("/")
    return path if storage.is_remote(path) else os.path.abspath(path)


def _names(folder: str) -> frozenset[str]:
    if not gfile.isdir(folder):
        return frozenset()
    return frozenset(name.rstrip("/") for name in gfile.listdir(folder))


def _stamp(text: str, form: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.strptime(text, form).replace(tzinfo=datetime.UTC)
    except ValueError:
        return None


def _older_than(when: datetime.datetime | None, days: int, now: datetime.datetime) -> bool:
    """Whether `when` is more than `days` days before `now` (never, for 0 days or no time)."""
    return days > 0 and when is not None and now - when > datetime.timedelta(days=days)


def read_night(output_root: str, date: str) -> Night:
    """The night's folders, whether it is settled, and its verdict while its model is there."""
    run_dir = layout.run_dir(output_root, date)
    entries = _names(run_dir)
    evaluate_dir = layout.evaluate_dir(output_root, date)
    metrics = layout.join(evaluate_dir, layout.METRICS_FILE)
    busy = run_lock.in_progress(run_dir) and not run_lock.held_here(run_dir)
    settled = "evaluate" in entries and gfile.exists(metrics) and not busy
    train = _names(layout.train_dir(output_root, date)) if "train" in entries else frozenset()
    blessed = None
    if settled and layout.MODEL_FILE in train:
        found = atomic.read_json_object(layout.join(evaluate_dir, layout.BLESSING_FILE)).get(
            "blessed"
        )
        blessed = found if isinstance(found, bool) else None
    return Night(date, settled, blessed, entries, train)


def protected(output_root: str, nights: list[Night]) -> Protected:
    """What the latest pointer names, and every served version of a night not settled.

    Raises:
        PointerUnreadableError: latest.json cannot be read, so what it names is not known.
    """
    current = pointer.read(output_root) or {}
    paths = [
        _comparable(pointer.resolve(output_root, value))
        for value in (current.get("model_path"), current.get("metrics_path"))
        if isinstance(value, str) and value
    ]
    metrics = current.get("metrics_path")
    if isinstance(metrics, str) and metrics:
        paths.append(os.path.dirname(_comparable(pointer.resolve(output_root, metrics))))
    version = current.get("version")
    if current and not isinstance(version, int) and isinstance(metrics, str) and metrics:
        evaluate_dir = os.path.dirname(pointer.resolve(output_root, metrics))
        version = atomic.read_json_object(layout.join(evaluate_dir, layout.PUSH_FILE)).get(
            "version"
        )
    version_dates = {night.date for night in nights if not night.settled}
    if current and not isinstance(version, int):
        version_dates.add(str(current.get("date")))  # every push of its date, to be safe
    versions = frozenset([version] if isinstance(version, int) else [])
    return Protected(tuple(paths), versions, frozenset(version_dates))


def _shard_sets(root: str, settings: Settings, newest_first: list[Night]) -> list[Removal]:
    keep = settings.keep_shard_sets
    reason = f"older than the newest {keep} evaluated nights"
    return [
        Removal(SHARD_SET, layout.data_dir(root, night.date), reason, SHARD_SET_FIRST)
        for night in newest_first[keep:]
        if keep and "data" in night.entries
    ]


def _checkpoints(root: str, settings: Settings, nights: list[Night]) -> list[Removal]:
    if settings.keep_checkpoints:
        return []
    kinds = ((layout.FINAL_CHECKPOINT_DIR, CHECKPOINT), (layout.BACKUP_DIR, BACKUP))
    return [
        Removal(kind, layout.join(layout.train_dir(root, night.date), name), "night evaluated")
        for night in nights
        for name, kind in kinds
        if name in night.train_entries
    ]


def _superseded(
    root: str, settings: Settings, nights: list[Night], now: datetime.datetime
) -> list[Removal]:
    found = []
    reason = f"moved aside more than {settings.superseded_days} days ago"
    for night in nights:
        if SUPERSEDED_DIR not in night.entries:
            continue
        folder = layout.join(layout.run_dir(root, night.date), SUPERSEDED_DIR)
        found += [
            Removal(SUPERSEDED, layout.join(folder, name), reason)
            for name in sorted(_names(folder))
            if _older_than(_stamp(name, STAMP_FORMAT), settings.superseded_days, now)
        ]
    return found


def _models(
    root: str, settings: Settings, newest_first: list[Night], now: datetime.datetime
) -> list[Removal]:
    def model(night: Night) -> str:
        return layout.join(layout.train_dir(root, night.date), layout.MODEL_FILE)

    keep, days = settings.keep_blessed_models, settings.not_blessed_model_days
    blessed = [night for night in newest_first if night.blessed is True]
    found = [
        Removal(BLESSED_MODEL, model(night), f"older than the newest {keep} blessed nights")
        for night in blessed[keep:]
        if keep
    ]
    for night in newest_first:
        if night.blessed is False and _older_than(_verdict_time(root, night.date), days, now):
            found.append(
                Removal(NOT_BLESSED_MODEL, model(night), f"not blessed, over {days} days old")
            )
    return found


def _verdict_time(root: str, date: str) -> datetime.datetime:
    """When a night's verdict was made (blessing.json's `decided_utc`), so that a night judged
    again today (a backfill, a forced re-evaluation) keeps its model its full days; the start
    of its date when the verdict does not say."""
    path = layout.join(layout.evaluate_dir(root, date), layout.BLESSING_FILE)
    unreadable: tuple[type[BaseException], ...] = (
        *gfile.file_errors(),
        ValueError,
        TypeError,
        AttributeError,
    )
    try:
        decided = atomic.read_json(path).get("decided_utc")
        return datetime.datetime.fromisoformat(str(decided)).astimezone(datetime.UTC)
    except unreadable:
        return datetime.datetime.combine(dates.parse(date), datetime.time(), datetime.UTC)


def _quarantined_at(path: str, stamp: str) -> datetime.datetime | None:
    """When a version was quarantined: its note's time, else its folder name's."""
    try:
        when = datetime.datetime.fromisoformat(
            str(
                atomic.read_json_object(layout.join(path, layout.QUARANTINE_NOTE_FILE))[
                    "quarantined_utc"
                ]
            )
        )
    except (KeyError, ValueError):
        return _stamp(stamp, QUARANTINE_STAMP_FORMAT)
    return when if when.tzinfo else when.replace(tzinfo=datetime.UTC)


def _versions(target: Target, settings: Settings, now: datetime.datetime) -> list[Removal]:
    keep, days = settings.keep_served_versions, settings.quarantine_days
    served = sorted((int(n) for n in _names(target.served_dir) if n.isdigit()), reverse=True)
    found = [
        Removal(
            SERVED_VERSION,
            layout.join(target.served_dir, str(version)),
            f"older than the newest {keep} served versions",
            SAVED_MODEL_FIRST,
        )
        for version in served[keep:]
        if keep
    ]
    for name in sorted(_names(target.quarantine_dir)):
        head, _, stamp = name.partition("-")
        path = layout.join(target.quarantine_dir, name)
        if head.isdigit() and _older_than(_quarantined_at(path, stamp), days, now):
            reason = f"quarantined more than {days} days ago"
            found.append(Removal(QUARANTINED_VERSION, path, reason, SAVED_MODEL_FIRST))
    return found


def plan(target: Target, settings: Settings, now: datetime.datetime) -> list[Removal]:
    """Everything past keeping, what is protected left out.

    Raises:
        PointerUnreadableError: latest.json cannot be read (what it names is not known).
    """
    root = target.output_root
    nights = [read_night(root, date) for date in history.run_dates(root)]
    keep = protected(root, nights)
    settled = [night for night in reversed(nights) if night.settled]  # newest first
    found = (
        _shard_sets(root, settings, settled)
        + _checkpoints(root, settings, settled)
        + _superseded(root, settings, settled, now)
        + _models(root, settings, settled, now)
        + _versions(target, settings, now)
    )
    return [removal for removal in found if not keep.holds(removal)]
