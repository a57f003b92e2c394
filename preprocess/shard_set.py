"""A shard set's life on disk: staging folder, manifest document, publication in one step."""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import logging
import os
import pathlib
import posixpath
import socket
import subprocess
import time
import uuid
from importlib import metadata
from typing import Any

import tensorflow as tf

from contract import atomic, layout, manifest, records
from preprocess import drops, plan, sources, transforms
from preprocess.config import PreprocessConfig
from preprocess.errors import PreprocessError

PROJECT_ROOT = pathlib.Path(__file__).resolve().parents[1]
WRITER_LOCK = ".writer.lock"  # flocked by the staging folder's writer while it lives
WRITER_FILE = ".writer.json"  # host and pid of the writer, where flock is not available
UNLOCKED_GRACE_SECONDS = 60.0
_HELD_LOCKS: dict[str, Any] = {}
log = logging.getLogger(__name__)


def code_version() -> str:
    """`git describe` of the project when it is a checkout, else the installed version."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--tags"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        try:
            return metadata.version("nightly-trainer")
        except metadata.PackageNotFoundError:
            return "unknown"


def make_staging(data_dir: str) -> str:
    """Creates the staging folder `<data_dir>.tmp-<id>` beside the final one, proving it writable,
    and marks it as this process's for as long as the process lives (see remove_dead_staging).

    Raises:
        PreprocessError: the output folder cannot be created or written.
    """
    staging = f"{data_dir}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        tf.io.gfile.makedirs(staging)
        if _is_local(staging):
            handle = open(os.path.join(staging, WRITER_LOCK), "w")  # noqa: SIM115 (held for life)
            fcntl.flock(handle, fcntl.LOCK_EX)
            _HELD_LOCKS[staging] = handle
        else:
            writer = {"host": socket.gethostname(), "pid": os.getpid()}
            atomic.write_json_atomic(layout.join(staging, WRITER_FILE), writer)
    except (OSError, tf.errors.OpError) as e:
        reason = getattr(e, "message", None) or e.strerror or str(e)
        raise PreprocessError(
            f"cannot write to output folder {posixpath.dirname(data_dir)}: {reason}"
        ) from None
    return staging


def remove_dead_staging(data_dir: str) -> list[str]:
    """Removes staging folders of `data_dir` left by killed runs; returns what was removed.

    Only folders whose writer is gone: locally, whose writer lock nobody holds (a live writer
    keeps it locked); on object stores, whose writer was a process of this machine that no
    longer runs (others are left, and logged).
    """
    removed = []
    for staging in sorted(tf.io.gfile.glob(f"{data_dir}.tmp-*")):
        if _writer_gone(staging):
            log.warning("removing %s, left by a run that was killed", staging)
            remove(staging)
            removed.append(staging)
        else:
            log.info("leaving %s: its writer may still run", staging)
    return removed


def _writer_gone(staging: str) -> bool:
    if _is_local(staging):
        lock_path = os.path.join(staging, WRITER_LOCK)
        if not os.path.exists(lock_path):
            # Killed before its lock existed, or being created this instant: go by age.
            return time.time() - os.path.getmtime(staging) > UNLOCKED_GRACE_SECONDS
        with open(lock_path) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True
    try:
        writer = atomic.read_json(layout.join(staging, WRITER_FILE))
    except (OSError, ValueError, tf.errors.OpError):
        return False
    if writer.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(writer["pid"]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def keep_only(staging: str, paths: list[str]) -> None:
    """Deletes everything in the staging folder but the listed files (relative paths): the
    sorted buckets, any fragments left, the file list, the writer mark, and any temporary file
    a retried task left."""
    remove(layout.join(staging, transforms.FRAGMENTS_DIR))
    remove(layout.join(staging, transforms.BUCKETS_DIR))
    keep = set(paths)
    for folder, _, names in tf.io.gfile.walk(staging):
        for name in names:
            path = layout.join(folder, name)
            if posixpath.relpath(path, staging) not in keep:
                tf.io.gfile.remove(path)


def feature_spec(adapter: str) -> dict[str, str]:
    """The manifest's description of a record's features (contract.records)."""
    spec = {records.IMAGE_KEY: "bytes: raw uint8 HxWxC", records.LABEL_KEY: "int64 class index"}
    if adapter == drops.ADAPTER:
        spec[records.DAY_KEY] = "bytes: the drop's day, YYYY-MM-DD (absent: an undated file's)"
    return spec


def build_manifest(
    cfg: PreprocessConfig,
    spec: sources.DatasetSpec,
    sizes: dict[str, int],
    files: list[dict[str, Any]],
    extra: dict[str, Any] | None = None,
    *,
    duplicates: int,
    eval_by_image: bool = False,
) -> dict[str, Any]:
    """The manifest document (schema in contract.manifest) of a written shard set.

    Args:
        cfg: the stage's parameters.
        spec: the dataset.
        sizes: examples per role ("train", and "eval" unless it was held out of the train
            split by rank).
        files: the written files' entries.
        extra: further top-level sections (the statistics file, the drops read).
        duplicates: eval examples whose image is also a train or validation example's.
        eval_by_image: the eval role was held out of the train split by image digest.

    Raises:
        PreprocessError: the written counts disagree with the dataset's split sizes.
    """
    held_out = "eval" not in sizes  # by rank
    train = plan.TrainPlan(
        sizes["train"],
        cfg.num_workers,
        cfg.validation_fraction,
        cfg.max_records_per_file,
        cfg.eval_fraction if held_out else 0.0,
    )
    counts = {s: sum(f["num_examples"] for f in files if f["split"] == s) for s in layout.SPLITS}
    expected = {
        layout.TRAIN_SPLIT: train.num_train,
        layout.VALIDATION_SPLIT: train.num_validation + train.leftover_examples,
        layout.EVAL_SPLIT: train.num_eval if held_out else sizes["eval"],
    }
    if counts != expected:
        raise PreprocessError(f"written example counts {counts} differ from expected {expected}")
    dataset: dict[str, Any] = {
        "name": spec.name,
        "version": spec.version,
        "adapter": spec.adapter,
        "train_split": cfg.train_split,
        "eval_split": cfg.eval_split,
    }
    if held_out or eval_by_image:
        chosen = "by image sha256" if eval_by_image else f"(seed {cfg.seed})"
        dataset["eval_split"] = (
            f"held-out {cfg.eval_fraction * 100:g}% of {cfg.train_split} {chosen}"
        )
        dataset["eval_held_out"] = {
            "fraction": cfg.eval_fraction,
            "of_split": cfg.train_split,
            "seed": cfg.seed,
            "num_examples": counts[layout.EVAL_SPLIT],
            "chosen_by": "image sha256" if eval_by_image else "rank of the seed's hash",
        }
    return {
        "schema_version": manifest.SCHEMA_VERSION,
        "dataset": dataset,
        "parameters": dataclasses.asdict(cfg),
        "num_workers": cfg.num_workers,
        "image_shape": spec.image_shape,
        "num_classes": len(spec.class_names),
        "class_names": spec.class_names,
        "feature_spec": feature_spec(spec.adapter),
        "splits": {
            layout.TRAIN_SPLIT: {
                "num_examples": train.num_train,
                "examples_per_worker": train.examples_per_worker,
                "leftover_examples": train.leftover_examples,
            },
            layout.VALIDATION_SPLIT: {
                "num_examples": counts[layout.VALIDATION_SPLIT],
                "held_out_examples": train.num_validation,
                "leftover_train_examples": train.leftover_examples,
            },
            layout.EVAL_SPLIT: {
                "num_examples": counts[layout.EVAL_SPLIT],
                "duplicates_in_training": duplicates,
            },
        },
        "files": sorted(files, key=lambda f: f["path"]),
        **(extra or {}),
        "code_version": code_version(),
        "created_utc": datetime.datetime.now(datetime.UTC).isoformat(),
    }


def _is_local(path: str) -> bool:
    return "://" not in path


def remove(path: str) -> None:
    """Deletes a folder tree if it exists; lets go of its writer lock if this process holds it."""
    handle = _HELD_LOCKS.pop(path, None)
    if handle is not None:
        handle.close()
    if tf.io.gfile.exists(path):
        tf.io.gfile.rmtree(path)


def publish(staging: str, final: str, doc: dict[str, Any]) -> None:
    """Moves the staged files to `final` so that the manifest appears last.

    Locally the whole folder is renamed at once, durably: every staged file and folder, then
    the manifest, reach the disk before the rename that marks the set complete, and the parent
    folder after it, before the set it replaces is deleted; so after a power loss `final` is
    the old set, nothing, or all of the new one. On object stores (no folder rename) each file
    is moved and the manifest is written after all of them (an upload is durable once done).
    """
    old = f"{final}.old-{uuid.uuid4().hex[:8]}"
    if tf.io.gfile.exists(final):
        tf.io.gfile.rename(final, old)
    if _is_local(final):
        _flush_tree(staging)
        atomic.write_json_atomic(layout.join(staging, layout.MANIFEST_FILE), doc)
        atomic.replace_durably(staging, final)
    else:
        paths = [entry["path"] for entry in doc["files"]]
        if manifest.STATISTICS_KEY in doc:
            paths.append(doc[manifest.STATISTICS_KEY]["path"])
        for path in paths:
            target = layout.join(final, path)
            tf.io.gfile.makedirs(posixpath.dirname(target))
            tf.io.gfile.rename(layout.join(staging, path), target, overwrite=True)
        atomic.write_json_atomic(layout.join(final, layout.MANIFEST_FILE), doc)
        remove(staging)
    remove(old)


def _flush_tree(folder: str) -> None:
    """Flushes every file under a local folder, and each subfolder's entries, to the disk."""
    for parent, subfolders, names in os.walk(folder, topdown=False):
        for name in names:
            atomic.fsync_path(os.path.join(parent, name))
        for name in subfolders:
            atomic.sync_folder(os.path.join(parent, name))
