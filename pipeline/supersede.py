"""Forcing a stage to rerun: move its outputs and its dependants' aside, never delete them.

The folders they go to are removed only by retention, [Retention] superseded_days later
(`pipeline.retention`).

`supersede(output_root, date, "train")` moves `<run>/train` and `<run>/evaluate` into
`<run>/superseded/<UTC timestamp>/`, so luigi sees them missing and reruns them, while the old
files stay for comparison. A local folder moves with one rename; on gs:// the files move one by
one, each stage's completion marker first.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import posixpath
import shutil
from collections.abc import Callable
from typing import Any

from contract import atomic, gfile, layout, storage
from contract import pointer as latest_pointer

logger = logging.getLogger(__name__)

SUPERSEDED_DIR = "superseded"
# How each `superseded/<timestamp>/` folder is named: when it was moved aside, in UTC.
STAMP_FORMAT = "%Y%m%dT%H%M%S.%fZ"
# Each stage's output folder, in pipeline order: forcing one forces everything after it.
STAGE_DIRS: dict[str, Callable[[str, str], str]] = {
    "preprocess": layout.data_dir,
    "train": layout.train_dir,
    "evaluate": layout.evaluate_dir,
}
STAGES = tuple(STAGE_DIRS)
# Where the files the latest pointer names are kept while their stage moves (see supersede).
KEEP_DIR = ".latest-pointer-keep"
POINTER_PATHS = ("model_path", "metrics_path")
POINTER_ATTEMPTS = 5  # reads and writes of the pointer before giving up on one that keeps moving
# The file whose presence marks each stage complete (written last by the stage).
STAGE_MARKERS = {
    "preprocess": layout.MANIFEST_FILE,
    "train": layout.HISTORY_FILE,
    "evaluate": layout.METRICS_FILE,
}


def stages_from(stage: str) -> list[str]:
    """The stage and every stage that depends on it.

    Raises:
        ValueError: `stage` is not a stage name.
    """
    if stage not in STAGE_DIRS:
        raise ValueError(f"unknown stage {stage!r}: choose one of {', '.join(STAGES)}")
    return list(STAGES[STAGES.index(stage) :])


def supersede(
    output_root: str, date: str, stage: str, now: datetime.datetime | None = None
) -> str | None:
    """Moves the outputs of `stage` and its dependants aside.

    When the latest pointer names files being moved (the blessed model, its metrics), it is
    moved along without ever naming a missing file, whenever the process is killed: under
    the pointer's lock, the named files are first linked (or copied) to a keep folder beside
    the moved stages, the pointer is pointed there, the stages move, the pointer is pointed
    at the files' new place, and only then does the keep folder go.

    Each pointer write decides on the pointer as it is read just before: on gs://, where the
    lock holds on one machine only, a pointer another host moved between that read and the
    write (its own blessing, say) is read again and decided on again, never overwritten; one
    that no longer names a moved file is left as it is.

    Returns:
        The folder they went to, or None when none of them existed.

    Raises:
        ValueError: `stage` is unknown.
        PointerMovedError: on gs://, the pointer kept moving under every write.
    """
    now = now or datetime.datetime.now(datetime.UTC)
    stamp = now.strftime(STAMP_FORMAT)
    destination = layout.join(layout.run_dir(output_root, date), SUPERSEDED_DIR, stamp)
    moves: dict[str, tuple[str, str]] = {}  # stage -> (source, target)
    for name in stages_from(stage):
        source = STAGE_DIRS[name](output_root, date)
        if gfile.exists(source):
            moves[name] = (source, layout.join(destination, posixpath.basename(source)))
    if not moves:
        logger.info("forced rerun of %s: nothing to move for %s", stage, date)
        return None
    # Under the lock evaluate holds while it reads, decides and moves the pointer.
    with latest_pointer.pointer_lock(output_root):
        keep = layout.join(destination, KEEP_DIR)
        targets = list(moves.values())
        kept: dict[str, str] = {}  # a named file's second name -> the file's place after the move

        def to_keep(current: dict[str, Any] | None) -> dict[str, Any] | None:
            kept.clear()
            named = {}
            for i, (key, (old, new)) in enumerate(_followed(output_root, current, targets).items()):
                if gfile.exists(old):  # a file already missing has nothing to keep
                    named[key] = layout.join(keep, str(i), posixpath.basename(old))
                    _keep_copy(old, named[key])
                    kept[_comparable(named[key])] = new
            return {**current, **named} if current is not None and named else None

        def to_new_place(current: dict[str, Any] | None) -> dict[str, Any] | None:
            moved = {key: new for key, (_, new) in _followed(output_root, current, targets).items()}
            for key in POINTER_PATHS:
                value = (current or {}).get(key)
                if isinstance(value, str) and value:
                    path = _comparable(latest_pointer.resolve(output_root, value))
                    if path in kept:
                        moved[key] = kept[path]
            return {**current, **moved} if current is not None and moved else None

        latest_pointer.update(output_root, to_keep, POINTER_ATTEMPTS, locked=True)
        for name, (source, target) in moves.items():
            _move_folder(source, target, STAGE_MARKERS[name])
            logger.info("forced rerun of %s: moved %s to %s", name, source, target)
        followed = latest_pointer.update(output_root, to_new_place, POINTER_ATTEMPTS, locked=True)
        if followed is not None:
            logger.info("the latest pointer follows its model to %s", followed["model_path"])
        if gfile.exists(keep):  # the pointer as last read or written does not name it
            _remove(keep)
    return destination


def _followed(
    output_root: str, pointer: dict[str, Any] | None, moves: list[tuple[str, str]]
) -> dict[str, tuple[str, str]]:
    """The pointer's paths that lie in a moved folder: key -> (path now, path after the move).

    The pointer keeps naming the same blessed model (and accuracy) at its new place; only a
    newly blessed run moves it to another model.
    """
    followed: dict[str, tuple[str, str]] = {}
    for key in POINTER_PATHS:
        value = (pointer or {}).get(key)
        if not isinstance(value, str) or not value:
            continue
        path = _comparable(latest_pointer.resolve(output_root, value))
        for source, target in moves:
            source = _comparable(source)
            if path.startswith(source + "/"):
                followed[key] = (path, _comparable(target) + path[len(source) :])
    return followed


def _keep_copy(path: str, kept: str) -> None:
    """A durable second name for `path` that the move leaves alone: a hard link where the
    filesystem has them (no bytes copied), else a copy."""
    gfile.makedirs(posixpath.dirname(kept))
    if storage.is_remote(path):
        gfile.copy(path, kept, overwrite=True)
        return
    try:
        os.link(path, kept)
    except OSError:
        shutil.copyfile(path, kept)
        atomic.fsync_path(kept)
    atomic.sync_folder(os.path.dirname(kept))


def _remove(folder: str) -> None:
    with contextlib.suppress(*gfile.not_found_errors()):
        gfile.rmtree(folder)


def _move_folder(source: str, target: str, marker: str) -> None:
    """Moves a stage's folder: one rename locally; file by file, marker first, on a store.

    An object store renames object by object, so a move can stop halfway. Moving the stage's
    completion marker first means a stage is never left looking complete without its files: a
    half-moved stage reruns, and the rest of it moves with the next `--force-stage`.
    """
    if not storage.is_remote(source):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.rename(source, target)
        atomic.sync_folder(os.path.dirname(target))
        atomic.sync_folder(os.path.dirname(source))
        return
    files = [
        posixpath.join(folder, name) for folder, _, names in gfile.walk(source) for name in names
    ]
    first = layout.join(source, marker)
    for path in sorted(files, key=lambda p: (p != first, p)):
        destination = target + path[len(source) :]
        gfile.makedirs(posixpath.dirname(destination))
        gfile.rename(path, destination, overwrite=True)
    with contextlib.suppress(*gfile.not_found_errors()):
        gfile.rmtree(source)  # the folder markers left behind


def _comparable(path: str) -> str:
    """Local paths made absolute (the pointer may hold either form); URLs as they are."""
    return path if storage.is_remote(path) else os.path.abspath(path)
