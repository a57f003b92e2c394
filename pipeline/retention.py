"""Retention: removes what [Retention] lets go of an output root, and reports what it did.

`run_pass(target, settings)` plans (`pipeline.retention_plan`) and removes under the latest
pointer's lock, so no evaluation, rollback or `--force-stage` moves what the plan protects while
it runs. Every FullRun runs it as it ends (its ledger record's `retention`), and so does
`python -m pipeline gc`. A folder goes its completion files first (`Removal.first`), so one cut
short by a crash never looks whole and the next pass finishes it. A removal that fails is an
entry of the result's `errors`, never an exception: retention never fails a night.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from typing import Any

from contract import gfile, layout, ledger, pointer
from evaluate.config import SERVING_DIR
from pipeline.retention_config import Settings
from pipeline.retention_plan import Removal, Target, plan

logger = logging.getLogger("luigi-interface")


@dataclasses.dataclass
class Result:
    """What a pass removed (or would, on a dry run), and what it could not."""

    dry_run: bool
    removed: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    errors: list[dict[str, str | None]] = dataclasses.field(default_factory=list)

    def lines(self) -> list[str]:
        """One line per thing removed, or that would be: `removed: <kind> <path> (<why>)`."""
        verb = "would remove" if self.dry_run else "removed"
        return [
            f"{verb}: {item['kind']} {item['path']} ({item['reason']})" for item in self.removed
        ]

    def record(self) -> dict[str, Any]:
        """The pass as the run ledger keeps it."""
        return {
            "dry_run": self.dry_run,
            "removed": self.removed,
            "bytes_freed": sum(item["bytes"] for item in self.removed),
            "errors": self.errors,
        }


def target_of(output_root: str, export_base: str | None, model_name: str) -> Target:
    """The target of a night with these settings (no export base: `<output_root>/serving`)."""
    return Target(output_root, export_base or layout.join(output_root, SERVING_DIR), model_name)


def _size(path: str) -> int:
    if gfile.isdir(path):
        return ledger.folder_bytes(path)
    return gfile.stat(path).length if gfile.exists(path) else 0


def remove(removal: Removal) -> None:
    """Removes the file or folder, the names in `first` before the rest."""
    for path in [layout.join(removal.path, name) for name in removal.first] + [removal.path]:
        if gfile.isdir(path):
            gfile.rmtree(path)
        elif gfile.exists(path):
            gfile.remove(path)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def run_pass(
    target: Target,
    settings: Settings,
    dry_run: bool = False,
    now: datetime.datetime | None = None,
) -> Result:
    """Removes (on a dry run only lists) what is past keeping.

    Returns:
        What was removed, and an error for each removal that failed (or for the whole pass,
        with a null path, when the output root could not be read); nothing is raised.
    """
    now = now or datetime.datetime.now(datetime.UTC)
    result = Result(dry_run)
    try:
        with pointer.pointer_lock(target.output_root):
            for removal in plan(target, settings, now):
                _carry_out(removal, result)
    except Exception as e:  # noqa: BLE001 - retention never fails the night
        result.errors.append({"path": None, "error": _one_line(e)})
    for error in result.errors:
        what = error["path"] or f"anything under {target.output_root}"
        logger.warning("retention could not remove %s: %s", what, error["error"])
    return result


def _carry_out(removal: Removal, result: Result) -> None:
    try:
        size = _size(removal.path)
        if not result.dry_run:
            remove(removal)
    except Exception as e:  # noqa: BLE001 - a failed removal is recorded; the others go on
        result.errors.append({"path": removal.path, "error": _one_line(e)})
        return
    item = {"kind": removal.kind, "path": removal.path, "reason": removal.reason}
    result.removed.append(item | {"bytes": size})
