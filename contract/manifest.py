"""The shard-set manifest: its schema, reading it with clear errors, and verifying files against it.

Schema (version 1), written last by the preprocess stage as `<data dir>/manifest.json`:

    {
      "schema_version": 1,
      "dataset": {"name": str (the --dataset value), "version": str,
                  "adapter": "tfds" | "imagefolder" | "tfrecord" | "drops" (absent: tfds),
                  "train_split": str, "eval_split": str (TFDS split syntax, or
                  "held-out 10% of train (seed 0)" when it was cut from the train split by
                  the rank of the seed's hash, "held-out 10% of train by image sha256" when
                  daily drops' eval was cut by each image's sha256),
                  "eval_held_out": {"fraction": float, "of_split": str, "seed": int,
                                    "num_examples": int, "chosen_by": "rank of the seed's
                                    hash" | "image sha256"} (only when it was cut)},
      "parameters": {...the preprocess parameters...},
      "num_workers": int,
      "image_shape": [H, W, C],
      "num_classes": int,
      "class_names": [str, ...] (by label index: TFDS ClassLabel names, the sorted class
                     folders of an image folder, a TFRecord's label names or '0', '1', ...),
      "feature_spec": {"image": "bytes: raw uint8 HxWxC", "label": "int64 class index",
                       "day": "bytes: the drop's day, YYYY-MM-DD" (drops: datasets only; a
                              record of an undated file has none)},
      "splits": {
        "train": {"num_examples": int, "examples_per_worker": int, "leftover_examples": int},
        "validation": {"num_examples": int},
        "eval": {"num_examples": int,
                 "duplicates_in_training": int (eval examples whose image bytes, by sha256,
                                                are also a train or validation example's;
                                                at most the stage's max_eval_overlap;
                                                absent in older shard sets)}
      },
      "files": [{"path": str (relative), "split": str, "worker": int | null,
                 "num_examples": int, "sha256": str, "size_bytes": int}, ...],
      "statistics": {"path": "statistics.pb", "format": str, "sha256": str, "size_bytes": int}
                    (tensorflow-metadata DatasetFeatureStatisticsList of the data: "train" =
                    the train and validation splits, "eval"; absent in older shard sets),
      "drops": {"patterns": {split: [pattern, ...]}, "window_days": int,
                "days": [YYYY-MM-DD, ...] (the window, oldest first), "days_read": [...],
                "missing_days": [...],
                "files": [{"path": str (as read), "split": str, "date": str | null (null:
                           an undated pattern's file), "num_examples": int, "sha256": str,
                           "size_bytes": int}, ...]} (only for drops: datasets),
      "code_version": str,
      "created_utc": str
    }

Beside it the data gate (pipeline/data_gate_task.py, `python -m preprocess.data_gate`) writes
`anomalies.json` (what its checks of the train and eval statistics, and of a drops window's
days, found) and, last, `data_gate.json` (its verdict, with `reset_schema`), and keeps the
schema the data is checked against in `<output_root>/data_gate/schema.pbtxt`, written only by
a night that passed (or was accepted with `reset_schema`).
"""

from __future__ import annotations

from typing import Any

from contract import atomic, gfile, layout

SCHEMA_VERSION = 1
STATISTICS_KEY = "statistics"
STATISTICS_FILE = "statistics.pb"
DROPS_KEY = "drops"
# The data gate's files: in the shard set's folder, and (the schema) under the output root.
ANOMALIES_FILE = "anomalies.json"
DATA_GATE_FILE = "data_gate.json"
SCHEMA_DIR = "data_gate"
SCHEMA_FILE = "schema.pbtxt"
REQUIRED_KEYS = (
    "schema_version",
    "dataset",
    "num_workers",
    "image_shape",
    "num_classes",
    "class_names",
    "splits",
    "files",
)


class ManifestError(Exception):
    """A shard set does not match its manifest, or the manifest itself is missing or malformed."""


def read_manifest(data_dir: str) -> dict[str, Any]:
    """Reads and checks the manifest of a shard set.

    Raises:
        ManifestError: the manifest is missing, not JSON, or lacks a required key.
    """
    path = layout.join(data_dir, layout.MANIFEST_FILE)
    if not gfile.exists(path):
        raise ManifestError(f"manifest not found: {path} (run the preprocess stage first)")
    try:
        manifest = atomic.read_json(path)
    except ValueError as e:
        raise ManifestError(f"manifest is not valid JSON: {path} ({e})") from None
    if not isinstance(manifest, dict):
        raise ManifestError(f"manifest is not a JSON object: {path}")
    missing = [k for k in REQUIRED_KEYS if k not in manifest]
    if missing:
        raise ManifestError(f"manifest {path} lacks required keys: {', '.join(missing)}")
    if manifest["schema_version"] != SCHEMA_VERSION:
        raise ManifestError(
            f"manifest {path} has schema_version {manifest['schema_version']}, "
            f"this code reads {SCHEMA_VERSION}: rerun the preprocess stage"
        )
    return manifest


def file_entries(
    manifest: dict[str, Any], split: str, worker: int | None = None
) -> list[dict[str, Any]]:
    """The manifest's file entries of one split (and one worker, for train), in name order."""
    entries = [f for f in manifest["files"] if f["split"] == split]
    if worker is not None:
        entries = [f for f in entries if f["worker"] == worker]
    return sorted(entries, key=lambda f: f["path"])


def shard_paths_for_worker(data_dir: str, manifest: dict[str, Any], worker: int) -> list[str]:
    """Absolute paths of the train files assigned to one worker.

    Raises:
        ManifestError: the worker index is outside the shard set.
    """
    num_workers = manifest["num_workers"]
    if not 0 <= worker < num_workers:
        raise ManifestError(f"worker {worker} does not exist in a shard set of {num_workers}")
    return [
        layout.join(data_dir, f["path"]) for f in file_entries(manifest, layout.TRAIN_SPLIT, worker)
    ]


def split_paths(data_dir: str, manifest: dict[str, Any], split: str) -> list[str]:
    """Absolute paths of every file of a split."""
    return [layout.join(data_dir, f["path"]) for f in file_entries(manifest, split)]


def verify(data_dir: str, split: str | None = None, worker: int | None = None) -> dict[str, Any]:
    """Re-checks files against the manifest: existence, size and sha256.

    Args:
        data_dir: the shard set's folder.
        split: only this split's files (all splits when None).
        worker: only this worker's train files (with split 'train').

    Returns:
        The manifest, once every selected file matched.

    Raises:
        ManifestError: naming the first file that is missing or whose checksum differs.
    """
    manifest = read_manifest(data_dir)
    entries = sorted(manifest["files"], key=lambda f: f["path"])
    if split is not None and split not in layout.SPLITS:
        raise ManifestError(f"unknown split '{split}': one of {', '.join(layout.SPLITS)}")
    if worker is not None and split != layout.TRAIN_SPLIT:
        raise ManifestError(f"--worker selects train files: pass --split {layout.TRAIN_SPLIT}")
    if worker is not None and not 0 <= worker < manifest["num_workers"]:
        raise ManifestError(
            f"worker {worker} is not in this shard set: its workers are "
            f"0..{manifest['num_workers'] - 1}"
        )
    if split is not None:
        entries = file_entries(manifest, split, worker)
    for entry in entries:
        path = layout.join(data_dir, entry["path"])
        if not gfile.exists(path):
            raise ManifestError(f"shard file missing: {path}")
        size = gfile.stat(path).length
        if size != entry["size_bytes"]:
            raise ManifestError(
                f"shard file size mismatch: {path} has {size} bytes, "
                f"manifest says {entry['size_bytes']}"
            )
        digest = atomic.sha256_file(path)
        if digest != entry["sha256"]:
            raise ManifestError(
                f"shard file checksum mismatch: {path} (sha256 {digest}, "
                f"manifest says {entry['sha256']})"
            )
    return manifest


def steps_per_epoch(doc: dict[str, Any], per_worker_batch_size: int) -> int:
    """Steps every worker runs per epoch: the same on all workers, from the manifest."""
    per_worker = doc["splits"][layout.TRAIN_SPLIT]["examples_per_worker"]
    return int(per_worker // per_worker_batch_size)
