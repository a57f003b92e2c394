"""One output root is one model lineage: the dataset its schema, pointer and served model are of.

The data gate records the lineage (`<output_root>/data_gate/lineage.json`) when it keeps a
schema: the first night that passes, and a night run with `reset_schema`, which starts a new
lineage and says so. A night of another dataset in the same root would fail at every later
gate (another image size, other classes) and compare models of other data: it is refused in
one line before any work (`mismatch`), naming the root's dataset and the two ways out.

A dataset's `identity` (the adapter that read it, its name or file patterns, the image shape
and the class names) is recorded with the lineage, in every evaluation's metrics and in the
latest pointer. Evaluate compares a candidate only with a pointer's model of the same identity,
and neither it nor rollback moves the pointer to a night of another (`differences`).
"""

from __future__ import annotations

import datetime
from typing import Any

from contract import atomic, gfile, layout, manifest

LINEAGE_FILE = "lineage.json"
# What a dataset is, for comparing models: not its version, which a folder of files (or of
# daily drops) changes with every file added.
IDENTITY_FIELDS = ("adapter", "dataset", "image_shape", "class_names")
# A manifest without an adapter was written by the TFDS adapter (contract.manifest).
DEFAULT_ADAPTER = "tfds"


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
        **identity(shard_manifest),
        "version": dataset.get("version"),
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


def identity(shard_manifest: dict[str, Any]) -> dict[str, Any]:
    """The identity of a shard set's dataset (`IDENTITY_FIELDS`), from its manifest."""
    dataset = shard_manifest.get("dataset") or {}
    return {
        "adapter": dataset.get("adapter") or DEFAULT_ADAPTER,
        "dataset": dataset.get("name"),
        "image_shape": list(shard_manifest.get("image_shape") or []),
        "class_names": list(shard_manifest.get("class_names") or []),
    }


def recorded_identity(output_root: str) -> dict[str, Any] | None:
    """The identity of the root's lineage, or None before its first kept schema; a lineage
    recorded before identities were lacks the adapter, which is then not compared."""
    current = read(output_root)
    if current is None:
        return None
    return {k: current[k] for k in IDENTITY_FIELDS if current.get(k) is not None}


def _shape(value: Any) -> str:
    return "x".join(map(str, value)) if isinstance(value, list) else repr(value)


def differences(found: dict[str, Any] | None, expected: dict[str, Any] | None) -> str | None:
    """How identity `found` is not `expected`, in words ("image shape 32x32x3, not
    28x28x1; ..."), or None when they agree. A field either lacks is not compared, and an
    identity that is None (recorded before identities were) agrees with any."""
    if not isinstance(found, dict) or not isinstance(expected, dict):
        return None
    said = []
    for field in IDENTITY_FIELDS:
        if found.get(field) is None or expected.get(field) is None:
            continue
        if found[field] == expected[field]:
            continue
        if field == "image_shape":
            said.append(f"image shape {_shape(found[field])}, not {_shape(expected[field])}")
        elif field == "class_names":
            a, b = list(found[field]), list(expected[field])
            if len(a) != len(b):
                said.append(f"{len(a)} classes, not {len(b)}")
            else:
                i = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
                said.append(f"class {i} named {a[i]!r}, not {b[i]!r}")
        else:
            said.append(f"{field} {found[field]!r}, not {expected[field]!r}")
    return "; ".join(said) or None
