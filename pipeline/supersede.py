"""Forcing a stage to rerun: move its outputs and its dependants' aside, never delete them.

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
from collections.abc import Callable

import tensorflow as tf

from contract import layout, storage
from contract import pointer as latest_pointer

logger = logging.getLogger(__name__)

SUPERSEDED_DIR = "superseded"
# Each stage's output folder, in pipeline order: forcing one forces everything after it.
STAGE_DIRS: dict[str, Callable[[str, str], str]] = {
    "preprocess": layout.data_dir,
    "train": layout.train_dir,
    "evaluate": layout.evaluate_dir,
}
STAGES = tuple(STAGE_DIRS)
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

    Returns:
        The folder they went to, or None when none of them existed.

    Raises:
        ValueError: `stage` is unknown.
    """
    now = now or datetime.datetime.now(datetime.UTC)
    stamp = now.strftime("%Y%m%dT%H%M%S.%fZ")
    destination = layout.join(layout.run_dir(output_root, date), SUPERSEDED_DIR, stamp)
    moved: dict[str, str] = {}
    for name in stages_from(stage):
        source = STAGE_DIRS[name](output_root, date)
        if not tf.io.gfile.exists(source):
            continue
        target = layout.join(destination, posixpath.basename(source))
        _move_folder(source, target, STAGE_MARKERS[name])
        moved[source] = target
        logger.info("forced rerun of %s: moved %s to %s", name, source, target)
    if not moved:
        logger.info("forced rerun of %s: nothing to move for %s", stage, date)
        return None
    _follow_latest_pointer(output_root, moved)
    return destination


def _move_folder(source: str, target: str, marker: str) -> None:
    """Moves a stage's folder: one rename locally; file by file, marker first, on a store.

    An object store renames object by object, so a move can stop halfway. Moving the stage's
    completion marker first means a stage is never left looking complete without its files: a
    half-moved stage reruns, and the rest of it moves with the next `--force-stage`.
    """
    if not storage.is_remote(source):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.rename(source, target)
        return
    files = [
        posixpath.join(folder, name)
        for folder, _, names in tf.io.gfile.walk(source)
        for name in names
    ]
    first = layout.join(source, marker)
    for path in sorted(files, key=lambda p: (p != first, p)):
        destination = target + path[len(source) :]
        tf.io.gfile.makedirs(posixpath.dirname(destination))
        tf.io.gfile.rename(path, destination, overwrite=True)
    with contextlib.suppress(tf.errors.NotFoundError):
        tf.io.gfile.rmtree(source)  # the folder markers left behind


def _follow_latest_pointer(output_root: str, moved: dict[str, str]) -> None:
    """Keeps the `latest` pointer valid when the blessed model itself was moved aside.

    The pointer keeps naming the same blessed model (and accuracy) at its new place; only a
    newly blessed run moves it to another model.
    """
    # Under the lock evaluate holds while it reads, decides and moves the pointer.
    with latest_pointer.pointer_lock(output_root):
        pointer = latest_pointer.read(output_root)
        if pointer is None:
            return
        changed = False
        for key in ("model_path", "metrics_path"):
            value = pointer.get(key)
            if not isinstance(value, str) or not value:
                continue
            path = _comparable(latest_pointer.resolve(output_root, value))
            for source, target in moved.items():
                source = _comparable(source)
                if path.startswith(source + "/"):
                    pointer[key] = _comparable(target) + path[len(source) :]
                    changed = True
        if changed:
            latest_pointer.write(output_root, pointer)
            logger.info("the latest pointer follows its model to %s", pointer["model_path"])


def _comparable(path: str) -> str:
    """Local paths made absolute (the pointer may hold either form); URLs as they are."""
    return path if storage.is_remote(path) else os.path.abspath(path)
