"""Where each stage's files live under a run folder, and how shard files are named."""

from __future__ import annotations

import posixpath

from contract import dates

MANIFEST_FILE = "manifest.json"
TRAIN_SPLIT = "train"
VALIDATION_SPLIT = "validation"
EVAL_SPLIT = "eval"
SPLITS = (TRAIN_SPLIT, VALIDATION_SPLIT, EVAL_SPLIT)

# Files the train stage leaves in its folder (chief only); history.json is written last.
MODEL_FILE = "model.keras"
HISTORY_FILE = "history.json"
TRAIN_CONFIG_FILE = "config.json"
FINAL_CHECKPOINT_DIR = "checkpoint"
BACKUP_DIR = "backup"
TENSORBOARD_DIR = "tensorboard"

# Files the evaluate stage leaves in its folder; metrics.json is written last.
METRICS_FILE = "metrics.json"
BLESSING_FILE = "blessing.json"
PUSH_FILE = "push.json"  # the push to the serving folder: "pushed", "version"
LATEST_POINTER_FILE = "latest.json"

# Served versions live in `<export_base>/<model_name>/<YYYYMMDDNN>/`; a version taken out of
# service waits in `<export_base>/<model_name>.quarantine/<version>-<UTC time>/` with a note.
QUARANTINE_SUFFIX = ".quarantine"
QUARANTINE_NOTE_FILE = "quarantined.json"


def date_of_version(version: int) -> str:
    """The run date a served version was pushed for: 2026013101 -> `2026-01-31`."""
    day = str(version // 100)  # YYYYMMDDNN: the date's NN-th push
    return f"{day[:4]}-{day[4:6]}-{day[6:8]}"


def join(*parts: str) -> str:
    """Joins path parts with '/', which local paths, gs:// and every Beam filesystem accept."""
    return posixpath.join(*parts)


def run_dir(output_root: str, date: str) -> str:
    """The folder of one nightly run: `<output_root>/<date>`.

    Raises:
        dates.DateError: `date` is not `YYYY-MM-DD` (it would name another folder).
    """
    return join(output_root, dates.check(date))


def data_dir(output_root: str, date: str) -> str:
    """The preprocess stage's output folder (shards and manifest)."""
    return join(run_dir(output_root, date), "data")


def train_dir(output_root: str, date: str) -> str:
    """The train stage's output folder (model, checkpoints, history, TensorBoard)."""
    return join(run_dir(output_root, date), "train")


def evaluate_dir(output_root: str, date: str) -> str:
    """The evaluate stage's output folder (metrics, pictures, report, blessing)."""
    return join(run_dir(output_root, date), "evaluate")


def logs_dir(output_root: str, date: str) -> str:
    """Where a run keeps its logs."""
    return join(run_dir(output_root, date), "logs")


def worker_file_name(worker: int, num_workers: int, file_index: int, num_files: int) -> str:
    """Names one of a training worker's shard files, relative to the data folder."""
    return join(
        TRAIN_SPLIT,
        f"worker-{worker:05d}-of-{num_workers:05d}-file-{file_index:05d}-of-{num_files:05d}.tfrecord",
    )


def whole_split_file_name(split: str, file_index: int, num_files: int) -> str:
    """Names one file of a split that is written whole (validation, eval)."""
    return join(split, f"{split}-{file_index:05d}-of-{num_files:05d}.tfrecord")
