"""Forcing a stage to rerun: move its outputs and its dependants' aside, never delete them.

`supersede(output_root, date, "train")` moves `<run>/train` and `<run>/evaluate` into
`<run>/superseded/<UTC timestamp>/`, so luigi sees them missing and reruns them, while the old
files stay for comparison. Local folders only (a rename of a whole folder).
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Callable

import tensorflow as tf

from contract import atomic, layout
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
        ValueError: `stage` is unknown or `output_root` is not a local folder.
    """
    if "://" in output_root:
        raise ValueError(
            f"--force-stage moves folders and works on local output roots only, not "
            f"{output_root}: move <run>/<stage> aside with gsutil mv instead"
        )
    now = now or datetime.datetime.now(datetime.UTC)
    stamp = now.strftime("%Y%m%dT%H%M%S.%fZ")
    destination = layout.join(layout.run_dir(output_root, date), SUPERSEDED_DIR, stamp)
    moved: dict[str, str] = {}
    for name in stages_from(stage):
        source = STAGE_DIRS[name](output_root, date)
        if not os.path.exists(source):
            continue
        os.makedirs(destination, exist_ok=True)
        target = layout.join(destination, os.path.basename(source))
        os.rename(source, target)
        moved[source] = target
        logger.info("forced rerun of %s: moved %s to %s", name, source, target)
    if not moved:
        logger.info("forced rerun of %s: nothing to move for %s", stage, date)
        return None
    _follow_latest_pointer(output_root, moved)
    return destination


def _follow_latest_pointer(output_root: str, moved: dict[str, str]) -> None:
    """Keeps the `latest` pointer valid when the blessed model itself was moved aside.

    The pointer keeps naming the same blessed model (and accuracy) at its new place; only a
    newly blessed run moves it to another model.
    """
    path = layout.join(output_root, layout.LATEST_POINTER_FILE)
    # Under the lock evaluate holds while it reads, decides and moves the pointer.
    with latest_pointer.pointer_lock(output_root):
        if not tf.io.gfile.exists(path):
            return
        pointer = atomic.read_json(path)
        changed = False
        for key in ("model_path", "metrics_path"):
            value = os.path.abspath(pointer.get(key, ""))
            for source, target in moved.items():
                source, target = os.path.abspath(source), os.path.abspath(target)
                if value.startswith(source + os.sep):
                    pointer[key] = target + value[len(source) :]
                    changed = True
        if changed:
            atomic.write_json_atomic(path, pointer)
            logger.info("the latest pointer follows its model to %s", pointer["model_path"])
