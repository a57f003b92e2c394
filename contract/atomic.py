"""Writing a file so that readers see either nothing or the whole file."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

import tensorflow as tf


def write_bytes_atomic(path: str, data: bytes) -> None:
    """Writes to a temporary sibling, then renames over `path` (atomic on POSIX filesystems)."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with tf.io.gfile.GFile(tmp, "wb") as f:
        f.write(data)
    tf.io.gfile.rename(tmp, path, overwrite=True)


def write_json_atomic(path: str, obj: Any) -> None:
    """Writes `obj` as indented JSON, atomically."""
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def read_json(path: str) -> Any:
    """Reads a JSON file through tf.io.gfile (local paths and gs:// alike)."""
    with tf.io.gfile.GFile(path, "rb") as f:
        return json.loads(f.read())


def sha256_file(path: str, chunk_size: int = 1 << 20) -> str:
    """The hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()
