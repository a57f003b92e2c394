"""The run history: which nights were blessed, and the pointer to a blessed night's model.

A night is blessed when its evaluation finished (`<date>/evaluate/metrics.json`) with a
blessed verdict (blessing.json), was pushed to serving (push.json), and its model file still
has the sha256 its evaluation recorded. A night rolled back past carries
`<date>/evaluate/rolled_back.json` and is not returned to on its own, nor is a night of another
dataset identity (contract.lineage) than the one asked for. Evaluate (taking a rejected model's
pointer back), rollback and warm start all read the history through here.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from contract import atomic, dates, gfile, layout, lineage, pointer

logger = logging.getLogger(__name__)

# In `<date>/evaluate/`: the night was rolled back past; it is no longer a blessed night to
# return to (a re-evaluation of the date moves the file aside with the rest).
ROLLED_BACK_FILE = "rolled_back.json"


class NightError(Exception):
    """A night cannot be served: not blessed, not pushed, or its model is gone or changed."""


def night_pointer(output_root: str, date: str) -> dict[str, Any]:
    """The pointer to a blessed, pushed night's model, its model file checked.

    Raises:
        NightError: the night was never evaluated, not blessed or not pushed, or its model file
            is missing or no longer has the sha256 its evaluation recorded.
    """
    evaluate_dir = layout.evaluate_dir(output_root, date)
    metrics_path = layout.join(evaluate_dir, layout.METRICS_FILE)
    if not gfile.exists(metrics_path):
        raise NightError(f"{date} has no finished evaluation ({metrics_path} is missing)")
    verdict_path = layout.join(evaluate_dir, layout.BLESSING_FILE)
    verdict = atomic.read_json(verdict_path) if gfile.exists(verdict_path) else {}
    if not verdict.get("blessed"):
        raise NightError(f"{date} was not blessed ({verdict_path})")
    push_path = layout.join(evaluate_dir, layout.PUSH_FILE)
    push = atomic.read_json(push_path) if gfile.exists(push_path) else {}
    if not push.get("pushed"):
        raise NightError(f"{date}'s blessed model was never pushed to serving ({push_path})")
    metrics = atomic.read_json(metrics_path)
    model = metrics["model"]
    model_path = pointer.resolve(output_root, model["path"])
    if not gfile.exists(model_path):
        raise NightError(f"{date}'s model {model_path} is missing")
    if atomic.sha256_file(model_path) != model["sha256"]:
        raise NightError(
            f"{date}'s model {model_path} has changed since it was blessed (its sha256 is not "
            f"the {model['sha256'][:16]}… its metrics.json records)"
        )
    night = {
        "date": date,
        "model_path": model_path,
        "model_sha256": model["sha256"],
        "accuracy": metrics["accuracy"],
        "loss": metrics["loss"],
        "dataset": metrics["dataset"]["name"],
        "metrics_path": metrics_path,
        "version": int(push["version"]),
        "updated_utc": datetime.datetime.now(datetime.UTC).isoformat(),
    }
    identity = metrics["dataset"].get("identity")  # absent from older evaluations
    if identity is not None:
        night[pointer.IDENTITY_KEY] = identity
    return night


def rolled_back(output_root: str, date: str) -> bool:
    return bool(gfile.exists(layout.join(layout.evaluate_dir(output_root, date), ROLLED_BACK_FILE)))


def run_dates(output_root: str) -> list[str]:
    """The dated run folders under the root, oldest first."""
    if not gfile.isdir(output_root):
        return []
    names = {name.rstrip("/") for name in gfile.listdir(output_root)}
    return sorted(filter(dates.is_run_date, names), key=dates.parse)


def last_blessed_before(
    output_root: str, date: str, identity: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The pointer to the newest blessed, pushed, not rolled-back night before `date`, of the
    dataset `identity` when one is given (a night that records none is taken)."""
    earlier = [d for d in run_dates(output_root) if dates.parse(d) < dates.parse(date)]
    for night in reversed(earlier):
        if rolled_back(output_root, night):
            continue
        try:
            found = night_pointer(output_root, night)
        except NightError as e:
            logger.info("not returning to %s: %s", night, e)
            continue
        differ = lineage.differences(found.get(pointer.IDENTITY_KEY), identity)
        if differ is None:
            return found
        logger.info(
            "not returning to %s: its model is of another dataset lineage (%s)", night, differ
        )
    return None
