"""What [Retention] lets an output root hold, counted independently of the retention code.

Each kind retention removes is counted against its setting: the shard sets of evaluated nights
(keep_shard_sets), checkpoints and backups of evaluated nights (none), blessed nights' models
(keep_blessed_models, and the pointer's), not-blessed nights' models (none older than
not_blessed_model_days) and served versions (keep_served_versions, and the pointer's). The
bound is those counts at each kind's largest size, plus what retention keeps by design: logs,
evaluations, the ledger, the trend page, quarantined versions and superseded folders until
their days are up, and whatever a night that never finished left (it may be run again).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from typing import Any

from pipeline.simulation.disk import folder_bytes

SHARD_SETS = "shard sets"
BLESSED_MODELS = "blessed models"
NOT_BLESSED_MODELS = "not-blessed models"
SERVED_VERSIONS = "served versions"
CHECKPOINTS = "checkpoints"


@dataclasses.dataclass
class Occupancy:
    """How much an output root holds, against what retention allows.

    Attributes:
        total_bytes: every file under the output root.
        bound_bytes: what the retention settings allow it to hold now.
        counts: kind -> how many are there.
        kept_bytes: what retention keeps by design (see the module docstring).
        violations: one sentence per kind over its setting; empty when within the bound.
    """

    total_bytes: int
    bound_bytes: int
    counts: dict[str, int]
    kept_bytes: int
    violations: list[str]


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            document = json.load(f)
    except (OSError, ValueError):
        return {}
    return document if isinstance(document, dict) else {}


def _size(path: str) -> int:
    return folder_bytes(path) if os.path.isdir(path) else os.path.getsize(path)


def occupancy(
    output_root: str,
    served_dir: str,
    retention: dict[str, Any],
    today: datetime.date,
) -> Occupancy:
    """Counts the output root's kinds against `retention` ([Retention]'s values).

    Args:
        output_root: the output root.
        served_dir: `<export_base>/<model_name>`, whose version folders TF Serving reads.
        retention: the [Retention] settings the nights ran with.
        today: the date ages are counted to.
    """
    found: dict[str, list[int]] = {
        SHARD_SETS: [],
        BLESSED_MODELS: [],
        NOT_BLESSED_MODELS: [],
        SERVED_VERSIONS: [],
        CHECKPOINTS: [],
    }
    violations = []
    days = int(retention["not_blessed_model_days"])
    names = sorted(os.listdir(output_root)) if os.path.isdir(output_root) else []
    for name in names:
        night = os.path.join(output_root, name)
        metrics = os.path.join(night, "evaluate", "metrics.json")
        if not (os.path.isdir(night) and _is_date(name) and os.path.exists(metrics)):
            continue  # not a night, or one never evaluated: retention leaves it alone
        if os.path.isdir(os.path.join(night, "data")):
            found[SHARD_SETS].append(_size(os.path.join(night, "data")))
        for folder in ("checkpoint", "backup"):
            if os.path.isdir(os.path.join(night, "train", folder)):
                found[CHECKPOINTS].append(_size(os.path.join(night, "train", folder)))
                if not retention["keep_checkpoints"]:
                    violations.append(f"{name}, evaluated, still has train/{folder}/")
        model = os.path.join(night, "train", "model.keras")
        if not os.path.exists(model):
            continue
        verdict = _read_json(os.path.join(night, "evaluate", "blessing.json"))
        blessed = verdict.get("blessed")
        found[BLESSED_MODELS if blessed else NOT_BLESSED_MODELS].append(_size(model))
        # Days since the verdict, as [Retention] counts them (a night judged late, as these
        # past dates are, keeps its model its full days); its date when the verdict says none.
        decided = str(verdict.get("decided_utc") or name)[:10]
        age = (today - datetime.date.fromisoformat(decided)).days
        if not blessed and days and age > days:
            violations.append(
                f"{name}'s model, not blessed, was judged {age} days ago (over {days})"
            )
    if os.path.isdir(served_dir):
        for name in os.listdir(served_dir):
            if name.isdigit():
                found[SERVED_VERSIONS].append(_size(os.path.join(served_dir, name)))
    caps = {  # None: a setting of 0, keep all
        SHARD_SETS: _cap(retention["keep_shard_sets"]),
        BLESSED_MODELS: _cap(retention["keep_blessed_models"], 1),  # and the pointer's
        NOT_BLESSED_MODELS: _cap(days, 1),  # a night a day at most
        SERVED_VERSIONS: _cap(retention["keep_served_versions"], 1),  # and the pointer's
        CHECKPOINTS: None if retention["keep_checkpoints"] else 0,
    }
    allowed = 0
    for kind, cap in caps.items():
        if cap is None:
            allowed += sum(found[kind])
            continue
        allowed += cap * max(found[kind], default=0)
        if cap and len(found[kind]) > cap:
            violations.append(f"{len(found[kind])} {kind}, over the {cap} retention keeps")
    total = folder_bytes(output_root)
    managed = sum(sum(sizes) for sizes in found.values())
    return Occupancy(
        total_bytes=total,
        bound_bytes=total - managed + allowed,
        counts={kind: len(sizes) for kind, sizes in found.items()},
        kept_bytes=total - managed,
        violations=violations,
    )


def _cap(setting: Any, extra: int = 0) -> int | None:
    return None if not int(setting) else int(setting) + extra


def _is_date(name: str) -> bool:
    try:
        datetime.date.fromisoformat(name)
    except ValueError:
        return False
    return len(name) == 10
