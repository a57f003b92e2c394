"""Files on the local disk through Python's own functions, on a store (gs://) through
`tf.io.gfile`, with TensorFlow imported only when a store's path comes by.

The processes that only orchestrate, Luigi's and the training launcher, reach files through
here: for a local output root they never load TensorFlow, whose import costs seconds of CPU in
every one of them. A path with a scheme (`gs://...`) goes to `tf.io.gfile`, as do a copy or a
rename with a store on either side.

Errors: a local path raises Python's (`FileNotFoundError`, `FileExistsError`, other
`OSError`s), a store's path TensorFlow's (`tf.errors.OpError` and its kinds); catch
`not_found_errors()` for a missing file on either, `file_errors()` for any failed read or
write.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections.abc import Iterator
from typing import IO, Any

from contract import storage


def _tf_gfile() -> Any:
    import tensorflow as tf

    return tf.io.gfile


def _remote(*paths: str) -> bool:
    return any(storage.is_remote(path) for path in paths)


def __getattr__(name: str) -> Any:
    if name == "errors":
        import tensorflow as tf

        return tf.errors
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _with_loaded_tf(
    python_error: type[BaseException], tf_error: str
) -> tuple[type[BaseException], ...]:
    """`python_error`, and TensorFlow's `tf.errors.<tf_error>` once TensorFlow is loaded (only
    then can a store's path have raised it)."""
    errors = getattr(sys.modules.get("tensorflow"), "errors", None)
    return (python_error, getattr(errors, tf_error)) if errors else (python_error,)


def not_found_errors() -> tuple[type[BaseException], ...]:
    """What a missing file raises, on the local disk or a store."""
    return _with_loaded_tf(FileNotFoundError, "NotFoundError")


def file_errors() -> tuple[type[BaseException], ...]:
    """What a failed read or write raises, on the local disk or a store."""
    return _with_loaded_tf(OSError, "OpError")


@dataclasses.dataclass(frozen=True)
class FileStat:
    """The field of `tf.io.gfile.stat` that is read here."""

    length: int


def exists(path: str) -> bool:
    if _remote(path):
        return bool(_tf_gfile().exists(path))
    return os.path.exists(path)


def isdir(path: str) -> bool:
    if _remote(path):
        return bool(_tf_gfile().isdir(path))
    return os.path.isdir(path)


def makedirs(path: str) -> None:
    if _remote(path):
        _tf_gfile().makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def listdir(path: str) -> list[str]:
    if _remote(path):
        return list(_tf_gfile().listdir(path))
    return os.listdir(path)


def GFile(path: str, mode: str = "r") -> IO[Any]:  # noqa: N802 (tf.io.gfile's name)
    if _remote(path):
        return _tf_gfile().GFile(path, mode)
    return open(path, mode)  # noqa: SIM115 (the caller closes it, as with tf.io.gfile)


def remove(path: str) -> None:
    if _remote(path):
        _tf_gfile().remove(path)
    else:
        os.remove(path)


def rmtree(path: str) -> None:
    if _remote(path):
        _tf_gfile().rmtree(path)
    else:
        shutil.rmtree(path)


def _refuse_existing(target: str, overwrite: bool) -> None:
    if not overwrite and os.path.exists(target):
        raise FileExistsError(f"{target} exists")


def rename(source: str, target: str, overwrite: bool = False) -> None:
    if _remote(source, target):
        _tf_gfile().rename(source, target, overwrite=overwrite)
        return
    _refuse_existing(target, overwrite)
    os.replace(source, target)


def copy(source: str, target: str, overwrite: bool = False) -> None:
    if _remote(source, target):
        _tf_gfile().copy(source, target, overwrite=overwrite)
        return
    _refuse_existing(target, overwrite)
    shutil.copyfile(source, target)


def stat(path: str) -> FileStat:
    if _remote(path):
        return FileStat(int(_tf_gfile().stat(path).length))
    return FileStat(os.stat(path).st_size)


def walk(top: str) -> Iterator[tuple[str, list[str], list[str]]]:
    if _remote(top):
        yield from _tf_gfile().walk(top)
    else:
        yield from os.walk(top)


def upload_folder(local_dir: str, remote_dir: str) -> list[str]:
    """Copies every file under `local_dir` to the same relative place under `remote_dir`.

    Returns:
        The remote paths written (none when `local_dir` does not exist).
    """
    written: list[str] = []
    if not os.path.isdir(local_dir):
        return written
    for folder, _, files in os.walk(local_dir):
        for name in sorted(files):
            source = os.path.join(folder, name)
            relative = os.path.relpath(source, local_dir).replace(os.sep, "/")
            target = f"{remote_dir.rstrip('/')}/{relative}"
            makedirs(target.rsplit("/", 1)[0])
            copy(source, target, overwrite=True)
            written.append(target)
    return written
