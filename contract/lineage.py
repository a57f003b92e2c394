"""One output root is one model lineage: the dataset its schema, pointer and served model are of.

The data gate records the lineage (`<output_root>/data_gate/lineage.json`) when it keeps a
schema: the first night that passes, and a night run with `reset_schema`, which starts a new
lineage and says so. A night of another dataset in the same root would fail at every later
gate (another image size, other classes) and compare models of other data: it is refused in
one line before any work (`mismatch`), naming the root's dataset and the two ways out.
"""

from __future__ import annotations

import datetime
from typing import Any

from contract import atomic, gfile, layout, manifest

LINEAGE_FILE = "lineage.json"


def lineage_path(output_root: str) -> str:
    return layout.join(output_root, manifest.SCHEMA_DIR, LINEAGE_FILE)


def read(output_root: str) -> dict[str, Any] | None:
    """The root's lineage, or None before its first kept schema (or for an older root)."""
    path = lineage_path(output_root)
    if not gfile.exists(path):
        return None
    document: dict[str, Any] = atomic.read_json(path)
    return document


def record(output_root: str, shard_manifest: dict[str, Any], date: str, reason: str) -> None:
    """Records the lineage of the shard set whose schema is being kept (the previous one, if
    any, is kept inside it as `replaces`)."""
    dataset = shard_manifest.get("dataset", {})
    document = {
        "dataset": dataset.get("name"),
        "version": dataset.get("version"),
        "image_shape": shard_manifest.get("image_shape"),
        "class_names": shard_manifest.get("class_names"),
        "since": date,
        "reason": reason,
        "recorded_utc": datetime.datetime.now(datetime.UTC).isoformat(),
        "replaces": read(output_root),
    }
    atomic.write_json_atomic(lineage_path(output_root), document)


def mismatch(output_root: str, dataset: str) -> str | None:
    """Why a night of `dataset` does not belong in `output_root`, or None when it does."""
    current = read(output_root)
    if current is None or current.get("dataset") in (None, dataset):
        return None
    return (
        f"the output root {output_root} holds the model lineage of dataset "
        f"{current['dataset']!r} (since {current.get('since')}), not {dataset!r}: use another "
        "--output-root, or pass --DataGate-reset-schema to start a new lineage here on purpose"
    )
