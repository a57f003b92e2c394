"""Writing a file so that readers see either nothing or the whole file, even after a power loss.

A rename marks a file complete (a stage's completion marker, the latest pointer, a backup's
state.json). On a local filesystem the rename can reach the disk before the file's bytes do:
after a power loss the name would then hold an empty or partial file. So the file is fsynced
before the rename and its folder after it, before anything that relies on it (deleting the
backup it replaces, say) happens. An object store's upload is durable once it returns.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable
from typing import Any

from contract import gfile, storage


def fsync_path(path: str) -> None:
    """Flushes a local file's bytes, or a local folder's entries, to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_folder(path: str) -> None:
    """Makes a local folder's entries (names created, renamed or removed in it) durable."""
    if not storage.is_remote(path):
        fsync_path(path or ".")


def sync_tree(path: str) -> None:
    """Flushes every file under a local folder, then every folder's entries, to the disk."""
    for directory, _, files in os.walk(path, topdown=False):
        for name in files:
            fsync_path(os.path.join(directory, name))
        fsync_path(directory)


def replace_durably(tmp: str, path: str) -> None:
    """Renames the complete file `tmp` over `path`, durably.

    Locally: `tmp`'s bytes are flushed before the rename and the folder's entry after it, so
    after a crash `path` holds either the old file or all of the new one. On a store the
    rename is the store's (the upload of `tmp` was durable already).
    """
    if storage.is_remote(path):
        gfile.rename(tmp, path, overwrite=True)
        return
    fsync_path(tmp)
    os.replace(tmp, path)
    sync_folder(os.path.dirname(path))


def write_bytes_atomic(path: str, data: bytes) -> None:
    """Writes to a temporary sibling, then renames it over `path` (`replace_durably`)."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with gfile.GFile(tmp, "wb") as f:
        f.write(data)
    replace_durably(tmp, path)


def write_json_atomic(path: str, obj: Any) -> None:
    """Writes `obj` as indented JSON, atomically."""
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def write_file_atomic(path: str, write: Callable[[str], None]) -> None:
    """`write(temporary sibling path)`, then `replace_durably` over `path`, creating its folder.

    For files another writer makes (a TFRecord writer, a copy); a failed write removes its
    temporary file, so a retry never leaves half a file under either name.
    """
    folder = os.path.dirname(path)
    if folder and not gfile.exists(folder):
        gfile.makedirs(folder)
        sync_folder(os.path.dirname(folder))  # the new folder's own name
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        write(tmp)
        replace_durably(tmp, path)
    finally:
        if gfile.exists(tmp):
            gfile.remove(tmp)


def copy_atomic(source: str, target: str) -> None:
    """Copies `source` to `target` (any filesystems) through a temporary sibling."""
    write_file_atomic(target, lambda tmp: gfile.copy(source, tmp, overwrite=True))


def read_json(path: str) -> Any:
    """Reads a JSON file through tf.io.gfile (local paths and gs:// alike)."""
    with gfile.GFile(path, "rb") as f:
        return json.loads(f.read())


def read_json_object(path: str) -> dict[str, Any]:
    """A JSON object file, or {} when it is missing, unreadable or not an object."""
    errors: tuple[type[BaseException], ...] = (*gfile.file_errors(), ValueError)
    try:
        document = read_json(path)
    except errors:
        return {}
    return document if isinstance(document, dict) else {}


def sha256_file(path: str, chunk_size: int = 1 << 20) -> str:
    """The hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with gfile.GFile(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()
