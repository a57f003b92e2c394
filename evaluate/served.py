"""What is served agrees with what was blessed: the pointer, the served versions, quarantine.

The invariant: the model `latest.json` names, the newest version under
`<export_base>/<model_name>/` (the one TF Serving's default policy serves) and the last blessed,
not rolled-back night are one model (sha256). Evaluate pushes a blessed model, then moves the
pointer, then writes metrics.json; a crash between the push and the pointer leaves a served
version newer than the pointer's. `reconcile`, run by every evaluation (before and after it
decides, under the pointer's lock) and by rollback, repairs that: a served version newer than
the one the pointer names has no blessed night behind it and is moved out of the served folder
into `<export_base>/<model_name>.quarantine/<version>-<UTC time>/`, with one line saying so. A
repair never deletes; retention removes quarantined versions after `[Retention]`'s days.
`problems` lists what does not agree, for a status check or a test.
"""

from __future__ import annotations

import datetime
import logging
import os
from typing import Any

from contract import atomic, gfile, layout, pointer, storage
from evaluate import report
from evaluate.versions import (
    PUSH_MARKER,
    SAVED_MODEL_PB,
    copy_version,
    read_marker,
    version_for_date,
)

logger = logging.getLogger(__name__)

QUARANTINE_SUFFIX = layout.QUARANTINE_SUFFIX
QUARANTINE_NOTE = layout.QUARANTINE_NOTE_FILE


def model_dir(export_base: str, model_name: str) -> str:
    return layout.join(export_base, model_name)


def quarantine_dir(export_base: str, model_name: str) -> str:
    """Beside the served folder, where TF Serving does not look."""
    return layout.join(export_base, model_name + QUARANTINE_SUFFIX)


def served_versions(export_base: str, model_name: str) -> list[int]:
    """The version folders TF Serving would consider (names that are whole numbers), sorted."""
    folder = model_dir(export_base, model_name)
    if not gfile.isdir(folder):
        return []
    names = (name.rstrip("/") for name in gfile.listdir(folder))
    return sorted(int(name) for name in names if name.isdigit())


def pointer_version(current: dict[str, Any], output_root: str | None = None) -> int:
    """The served version the pointer's model was pushed as.

    A pointer written before pointers recorded their version names it through its night's
    push.json when `output_root` is given, else by its date (the date's first push).
    """
    version = current.get("version")
    if isinstance(version, int):
        return version
    metrics_path = current.get("metrics_path")
    if output_root is not None and isinstance(metrics_path, str) and metrics_path:
        folder = os.path.dirname(pointer.resolve(output_root, metrics_path))
        push_path = layout.join(folder, report.PUSH_FILE)
        if gfile.exists(push_path):
            pushed = atomic.read_json(push_path).get("version")
            if isinstance(pushed, int):
                return pushed
    return version_for_date(str(current["date"]))


def _quarantined_versions(export_base: str, model_name: str) -> dict[str, int]:
    """Quarantine folder name -> the version it holds."""
    folder = quarantine_dir(export_base, model_name)
    if not gfile.isdir(folder):
        return {}
    names = (name.rstrip("/") for name in gfile.listdir(folder))
    return {name: int(name.split("-")[0]) for name in names if name.split("-")[0].isdigit()}


def next_sequence(export_base: str, model_name: str, date: str, model_sha256: str) -> int:
    """Which push of `date` a model is: the sequence of a version (served or quarantined)
    already holding it, else one past the date's highest sequence (0 for its first push).

    A retrained date's model thus gets a new, higher version than the one it replaces: TF
    Serving never reloads a version in place. Two versions may hold the same model (a night
    pushed, quarantined and pushed again); the lowest is reused.
    """
    first = version_for_date(date)
    folders = {
        layout.join(model_dir(export_base, model_name), str(v)): v
        for v in served_versions(export_base, model_name)
    }
    folders |= {
        layout.join(quarantine_dir(export_base, model_name), name): v
        for name, v in _quarantined_versions(export_base, model_name).items()
    }
    # Only finished pushes (with their marker) count: a folder without one never held a model
    # TF Serving could load.
    pushed = {
        version: marker.get("model_sha256")
        for path, version in folders.items()
        if first <= version < first + 100 and (marker := read_marker(path)) is not None
    }
    for version in sorted(pushed):
        if pushed[version] == model_sha256:
            return version - first
    return max(pushed) - first + 1 if pushed else 0


def _utc_stamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")


def _move_folder(source: str, target: str) -> None:
    """Moves a version folder: one rename locally; on gs:// a copy in the order a push copies
    (graph and marker last, `copy_version`), then the source removed marker and graph
    first, so neither side ever looks like a finished model before it is one."""
    if not storage.is_remote(source):
        gfile.makedirs(os.path.dirname(target))
        os.rename(source, target)
        atomic.sync_folder(os.path.dirname(target))
        atomic.sync_folder(os.path.dirname(source))
        return
    copy_version(source, target)
    for name in (PUSH_MARKER, SAVED_MODEL_PB):
        if gfile.exists(layout.join(source, name)):
            gfile.remove(layout.join(source, name))
    gfile.rmtree(source)


def quarantine(export_base: str, model_name: str, version: int, reason: str) -> str:
    """Moves a served version out of the served folder, never deleting it.

    Returns:
        The folder it now lives in.
    """
    source = layout.join(model_dir(export_base, model_name), str(version))
    target = layout.join(quarantine_dir(export_base, model_name), f"{version}-{_utc_stamp()}")
    _move_folder(source, target)
    atomic.write_json_atomic(
        layout.join(target, QUARANTINE_NOTE),
        {
            "version": version,
            "reason": reason,
            "from": source,
            "quarantined_utc": datetime.datetime.now(datetime.UTC).isoformat(),
        },
    )
    logger.warning("moved serving version %d out of %s to %s: %s", version, source, target, reason)
    return target


def restore(export_base: str, model_name: str, version: int, model_sha256: str) -> bool:
    """Moves a quarantined copy of `version` holding `model_sha256` back into the served folder.

    Returns:
        Whether one was found and moved back.
    """
    folder = quarantine_dir(export_base, model_name)
    names = sorted(_quarantined_versions(export_base, model_name).items(), reverse=True)
    for name, held in names:
        if held != version:
            continue
        candidate = layout.join(folder, name)
        marker = read_marker(candidate)
        if marker is not None and marker.get("model_sha256") == model_sha256:
            if gfile.exists(layout.join(candidate, QUARANTINE_NOTE)):
                gfile.remove(layout.join(candidate, QUARANTINE_NOTE))
            _move_folder(candidate, layout.join(model_dir(export_base, model_name), str(version)))
            logger.warning("moved serving version %d back from %s", version, candidate)
            return True
    return False


def reconcile(output_root: str, export_base: str, model_name: str) -> list[str]:
    """Quarantines every served version newer than the one the pointer names.

    Such a version has no blessed night behind it: a push whose pointer move never happened
    (a crash, or a verdict that changed on a retried pointer write), or a night rolled back
    past. The caller holds the pointer's lock, so no push is half way.

    Returns:
        The quarantine folders the versions were moved to.
    """
    current = pointer.read(output_root)
    keep = None if current is None else pointer_version(current, output_root)
    moved = []
    for version in served_versions(export_base, model_name):
        if current is None or keep is None:
            reason = "no latest.json names a blessed model"
        elif version > keep:
            reason = (
                f"it is newer than version {keep}, the model latest.json names "
                f"({current.get('date')}): no blessed night is behind it"
            )
        elif version < keep and version // 100 == keep // 100:
            reason = f"version {keep}, a retrain of the same date, replaces it"
        else:
            continue
        moved.append(quarantine(export_base, model_name, version, reason))
    return moved


def problems(output_root: str, export_base: str, model_name: str) -> list[str]:
    """How the pointer, the served versions and the blessed nights disagree ([] when they
    agree); each item is one sentence."""
    found = []
    current = pointer.read(output_root)
    versions = served_versions(export_base, model_name)
    if current is None:
        if versions:
            found.append(f"no latest.json, but versions {versions} are served")
        return found
    sha = current.get("model_sha256")
    model_path = pointer.resolve(output_root, str(current.get("model_path")))
    if not gfile.exists(model_path):
        found.append(f"latest.json names {model_path}, which is missing")
    elif atomic.sha256_file(model_path) != sha:
        found.append(f"latest.json's model {model_path} does not have the sha256 it records")
    metrics_path = current.get("metrics_path")
    if isinstance(metrics_path, str) and metrics_path:
        verdict_path = layout.join(
            os.path.dirname(pointer.resolve(output_root, metrics_path)), layout.BLESSING_FILE
        )
        if not gfile.exists(verdict_path) or not atomic.read_json(verdict_path).get("blessed"):
            found.append(f"latest.json names {current.get('date')}, whose verdict is not blessed")
    named = pointer_version(current, output_root)
    if not versions:
        found.append(f"latest.json names version {named}, but none is served")
        return found
    newest = versions[-1]
    if newest != named:
        found.append(
            f"the newest served version is {newest}, not {named}, the one latest.json names"
        )
    marker = read_marker(layout.join(model_dir(export_base, model_name), str(newest)))
    if marker is None or marker.get("model_sha256") != sha:
        found.append(f"served version {newest} does not hold the model latest.json names")
    return found
