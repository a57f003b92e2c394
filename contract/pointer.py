"""The `<output_root>/latest.json` pointer to the last blessed model: schema, read, write, lock.

Evaluate moves the pointer when it blesses a run; pipeline.supersede rewrites it when the
blessed model itself is moved aside. Both hold `pointer_lock(output_root)` while they read,
decide and move it, so two evaluations (or an evaluation and a supersede) never interleave.

The lock is `fcntl.flock` on `latest.json.lock` beside the pointer for a local root. For a
remote root (gs://...) the lock file lives in the root's local state folder
(`contract.storage.local_state_dir`), which serialises writers on one machine only; between
machines the object's generation does: `read_versioned` returns the generation it read and
`write(..., if_generation=g)` stores the pointer only if it is still that generation (GCS's
ifGenerationMatch), else raises PointerMovedError and the writer reads and decides again. So
two hosts cannot move the pointer backwards.

`write` stores paths relative to output_root (`2026-01-31/train/model.keras`), so a copied or
re-mounted runs folder keeps a valid pointer; pointers with absolute paths (written by older
versions) are still read, and `resolve(output_root, path)` gives the usable path for either.
Evaluate and supersede both write through `write`.

Crash consistency, with metrics.json as a date's completion marker (written last):
  1. evaluate writes its pictures, report and blessing.json;
  2. under the lock, it reads the pointer, decides and (if blessed) moves it;
  3. it writes metrics.json last.
A crash after 2 and before 3 leaves a pointer naming a date without metrics.json. Such a
pointer is incomplete (`is_complete`): it is never used as the comparison baseline, and the
rerun of that date's evaluation completes it (it may move the pointer again to the same date).
So a complete blessed date always has the pointer moved (or a newer blessed date past it),
and a pointer naming an incomplete date is only ever that date's own unfinished evaluation.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from typing import Any, NotRequired, TypedDict

from contract import atomic, gfile, layout, storage

# The pointer's record of the dataset its model is of (contract.lineage.identity).
IDENTITY_KEY = "dataset_identity"


class Pointer(TypedDict):
    """The pointer's fields; `model_path` and `metrics_path` are relative to output_root.

    `version` (the served version) and `dataset_identity` (adapter, dataset, image_shape,
    class_names) are absent from pointers written before they were recorded.
    """

    date: str
    model_path: str
    model_sha256: str
    accuracy: float
    loss: float
    dataset: str
    metrics_path: str
    updated_utc: str
    version: NotRequired[int]
    dataset_identity: NotRequired[dict[str, Any]]


def pointer_path(output_root: str) -> str:
    """Where the pointer lives: `<output_root>/latest.json`."""
    return layout.join(output_root, layout.LATEST_POINTER_FILE)


def relative(output_root: str, path: str) -> str:
    """`path` relative to output_root when it lies under it, else unchanged."""
    if storage.is_remote(output_root) or storage.is_remote(path):
        prefix = output_root.rstrip("/") + "/"
        return path[len(prefix) :] if path.startswith(prefix) else path
    root = os.path.abspath(output_root)
    absolute = os.path.abspath(path)
    if absolute.startswith(root + os.sep):
        return os.path.relpath(absolute, root)
    return path


def resolve(output_root: str, path: str) -> str:
    """A pointer path made usable: absolute and remote paths as they are, others under the root."""
    if storage.is_remote(path) or os.path.isabs(path):
        return path
    return layout.join(output_root, path)


class PointerMovedError(RuntimeError):
    """Another writer moved the pointer after it was read: read it and decide again."""


class PointerUnreadableError(ValueError):
    """`latest.json` is there but is not a pointer (truncated, hand-edited, not JSON)."""


def _parse(path: str, data: bytes) -> dict[str, Any]:
    """The pointer's document, or PointerUnreadableError naming the file and the way out."""
    try:
        document = json.loads(data)
    except ValueError as e:
        document, reason = None, f"not JSON: {e}"
    else:
        reason = "not a JSON object with a date and a model_path"
    if isinstance(document, dict) and "date" in document and "model_path" in document:
        return document
    raise PointerUnreadableError(
        f"the latest pointer {path} is unreadable ({reason}): point it at a blessed night again "
        "with `python -m pipeline rollback --to DATE`, or move it away to start a new lineage"
    )


def read(output_root: str) -> dict[str, Any] | None:
    """The pointer as stored, or None before the first blessed run."""
    return read_versioned(output_root)[0]


def read_versioned(output_root: str) -> tuple[dict[str, Any] | None, int | None]:
    """The pointer (None before the first blessed run) and the version that was read.

    The version is the object's generation on gs:// (0 when there is no pointer yet), to pass
    to `write` as `if_generation`; None for a local root, whose lock is enough.
    """
    path = pointer_path(output_root)
    if storage.scheme(path) == "gs":
        return _read_gcs(path)
    if not gfile.exists(path):
        return None, None
    with gfile.GFile(path, "rb") as f:
        return _parse(path, f.read()), None


def write(output_root: str, pointer: dict[str, Any], if_generation: int | None = None) -> None:
    """Writes the pointer atomically, storing its paths relative to output_root.

    Args:
        if_generation: on gs://, write only if the pointer is still this generation (0: still
            absent), as `read_versioned` returned it; None writes whatever is there.

    Raises:
        PointerMovedError: the pointer is no longer at `if_generation`; nothing was written.
    """
    stored = dict(pointer)
    for key in ("model_path", "metrics_path"):
        if key in stored:
            stored[key] = relative(output_root, stored[key])
    path = pointer_path(output_root)
    if storage.scheme(path) == "gs" and if_generation is not None:
        _write_gcs(path, stored, if_generation)
        return
    atomic.write_json_atomic(path, stored)


def _gcs_blob(path: str) -> Any:
    import google.cloud.storage as gcs

    bucket, _, name = path.partition("://")[2].partition("/")
    return gcs.Client().bucket(bucket).blob(name)


def _read_gcs(path: str, attempts: int = 5) -> tuple[dict[str, Any] | None, int]:
    """The pointer object and its generation, read as one version (retried when it changes
    between looking up its generation and downloading it)."""
    from google.api_core import exceptions

    blob = _gcs_blob(path)
    for _ in range(attempts):
        try:
            blob.reload()
        except exceptions.NotFound:
            return None, 0
        generation = int(blob.generation)
        try:
            data = blob.download_as_bytes(if_generation_match=generation)
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            continue  # rewritten in between: look again
        return _parse(path, data), generation
    raise PointerMovedError(f"{path} kept changing while it was read ({attempts} times)")


def _write_gcs(path: str, stored: dict[str, Any], if_generation: int) -> None:
    from google.api_core import exceptions

    data = (json.dumps(stored, indent=2, sort_keys=True) + "\n").encode()
    try:
        # One request: the object is replaced whole, and only if still at that generation.
        _gcs_blob(path).upload_from_string(
            data, content_type="application/json", if_generation_match=if_generation
        )
    except exceptions.PreconditionFailed:
        raise PointerMovedError(
            f"{path} was moved by another writer after it was read (generation "
            f"{if_generation} is gone); read it and decide again"
        ) from None


def is_complete(output_root: str, pointer: dict[str, Any]) -> bool:
    """Whether the evaluation the pointer names finished (its metrics.json exists).

    A pointer that names no metrics file (written by hand or by an older version) counts as
    complete: only an evaluation that moved the pointer and then crashed leaves one whose
    metrics.json is missing.
    """
    metrics = pointer.get("metrics_path")
    if not isinstance(metrics, str) or not metrics:
        return True
    return bool(gfile.exists(resolve(output_root, metrics)))


def model_exists(output_root: str, pointer: dict[str, Any]) -> bool:
    """Whether the model the pointer names is there (a pointer naming none counts as there)."""
    model = pointer.get("model_path")
    if not isinstance(model, str) or not model:
        return True
    return bool(gfile.exists(resolve(output_root, model)))


def problem(output_root: str, pointer: dict[str, Any]) -> str | None:
    """What is wrong with a pointer, in one sentence, or None when it names what it should.

    A model that is gone (deleted by hand, or moved aside by an older `--force-stage` killed
    half way) leaves the pointer's accuracy as the only baseline; a metrics file that is
    missing is an evaluation of that date that has not finished.
    """
    date = pointer.get("date", "?")
    model = pointer.get("model_path")
    if not model_exists(output_root, pointer):
        return (
            f"the latest pointer ({pointer_path(output_root)}) names {date}'s model {model}, "
            "which is missing: restore it there, or rerun that date's evaluation to bless a "
            "model that exists"
        )
    if not is_complete(output_root, pointer):
        return (
            f"the latest pointer names {date}, whose evaluation has not finished (no "
            f"{pointer.get('metrics_path')}): not compared; rerun that date's evaluation"
        )
    return None


def update(
    output_root: str,
    decide: Callable[[dict[str, Any] | None], dict[str, Any] | None],
    attempts: int = 5,
    locked: bool = False,
) -> dict[str, Any] | None:
    """Moves the pointer to what `decide` makes of the current one, under `pointer_lock`.

    `decide(current)` returns the new pointer, or None to leave it. On gs://, when another
    host moved the pointer between the read and the write, the write is refused and `decide`
    is asked again about the pointer as it now is, so a pointer another host moved is never
    overwritten with a stale decision.

    Args:
        locked: the caller holds `pointer_lock` already (it is not taken again).

    Returns:
        The pointer written, or None when `decide` left it.

    Raises:
        PointerMovedError: the pointer moved under every one of `attempts` writes.
    """
    if not locked:
        with pointer_lock(output_root):
            return update(output_root, decide, attempts, locked=True)
    for attempt in range(1, attempts + 1):
        current, generation = read_versioned(output_root)
        new = decide(current)
        if new is None:
            return None
        try:
            write(output_root, new, if_generation=generation)
        except PointerMovedError:
            if attempt == attempts:
                raise
            continue
        return new
    return None


def _lock_file(output_root: str) -> str:
    folder = storage.local_state_dir(output_root)
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, layout.LATEST_POINTER_FILE + ".lock")


@contextlib.contextmanager
def pointer_lock(output_root: str) -> Iterator[None]:
    """Holds the pointer's exclusive lock (blocking) for the `with` block."""
    with open(_lock_file(output_root), "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
