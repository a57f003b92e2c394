"""Served versions as files: their numbers, their push marker, and copying one, without
TensorFlow.

A version's number is its run date and a two-digit sequence (2026-01-31 -> 2026013100, a
retrain of that date -> 2026013101). `PUSH_MARKER` inside a version folder, written last,
names the model the push came from; `SAVED_MODEL_PB` is the graph a server needs before it can
load anything. evaluate.serving writes versions; evaluate.served, rollback and retention move,
read and remove them, and for a local export base they need no TensorFlow (contract.gfile).
"""

from __future__ import annotations

from typing import Any

from contract import atomic, gfile, layout

PUSH_MARKER = "assets.extra/nightly_push.json"
SAVED_MODEL_PB = "saved_model.pb"
# Versions a date can take: its first push and 99 retrains.
MAX_SEQUENCE = 99


class VersionsUsedUp(ValueError):
    """A date has been pushed as many times as a version number can say."""


def version_for_date(date: str, sequence: int = 0) -> int:
    """The serving version of a run date's push: (`2026-01-31`, 1) -> 2026013101."""
    if not 0 <= sequence <= MAX_SEQUENCE:
        raise VersionsUsedUp(
            f"{date} has been pushed {MAX_SEQUENCE + 1} times already: no serving version is "
            "left for it; move its versions out of the served folder and quarantine"
        )
    return int(date.replace("-", "")) * 100 + sequence


def read_marker(version_dir: str) -> dict[str, Any] | None:
    """The push marker of a version folder, or None when the push never finished."""
    path = layout.join(version_dir, PUSH_MARKER)
    if not gfile.exists(path):
        return None
    marker: dict[str, Any] = atomic.read_json(path)
    return marker


def _files_under(folder: str) -> list[str]:
    """Every file under `folder`, relative to it, with '/' separators."""
    found = []
    for directory, _, files in gfile.walk(folder):
        rel_dir = directory[len(folder) :].strip("/")
        found += [f"{rel_dir}/{name}" if rel_dir else name for name in files]
    return sorted(found)


def copy_version(source: str, target: str, last_files: tuple[str, ...] = (SAVED_MODEL_PB,)) -> None:
    """Copies a version folder file by file, as an object store (gs://) moves a folder.

    TF Serving loads a version folder as soon as it lists it and the graph is there, so the
    format's `last_files` (a SavedModel's graph, without which nothing loads) are copied after
    every other file and the push marker after everything: a poll never finds a loadable
    model whose variables are still on their way.
    """
    files = _files_under(source)
    last = [name for name in (*last_files, PUSH_MARKER) if name in files]
    for name in [f for f in files if f not in last] + last:
        path = layout.join(target, name)
        gfile.makedirs(path.rsplit("/", 1)[0])
        gfile.copy(layout.join(source, name), path, overwrite=True)
