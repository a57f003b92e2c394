"""The Luigi target of every stage's output: one file wherever `tf.io.gfile` reaches.

`GFileTarget` works the same on a local path and on gs:// (the stages write through
tf.io.gfile too), so completeness, reruns and `--force-stage` behave alike on both.
A `luigi.LocalTarget` would never exist for a gs:// path.
"""

from __future__ import annotations

from typing import IO, Any

import luigi
import luigi.target
import tensorflow as tf


class GFileSystem(luigi.target.FileSystem):
    """Luigi's FileSystem interface over `tf.io.gfile` (local paths and gs://)."""

    def exists(self, path: str) -> bool:
        return bool(tf.io.gfile.exists(path))

    def remove(self, path: str, recursive: bool = True, skip_trash: bool = True) -> None:
        if tf.io.gfile.isdir(path):
            if not recursive:
                raise luigi.target.FileSystemException(f"{path} is a folder: pass recursive")
            tf.io.gfile.rmtree(path)
        elif tf.io.gfile.exists(path):
            tf.io.gfile.remove(path)

    def mkdir(self, path: str, parents: bool = True, raise_if_exists: bool = False) -> None:
        if raise_if_exists and tf.io.gfile.exists(path):
            raise luigi.target.FileAlreadyExists(path)
        tf.io.gfile.makedirs(path)

    def isdir(self, path: str) -> bool:
        return bool(tf.io.gfile.isdir(path))

    def listdir(self, path: str) -> list[str]:
        return [f"{path.rstrip('/')}/{name.rstrip('/')}" for name in tf.io.gfile.listdir(path)]

    def move(self, path: str, dest: str, raise_if_exists: bool = False) -> None:
        tf.io.gfile.rename(path, dest, overwrite=not raise_if_exists)


class GFileTarget(luigi.target.FileSystemTarget):
    """A stage's completion marker (manifest, history, metrics) on a local path or gs://."""

    fs = GFileSystem()

    def open(self, mode: str = "r") -> IO[Any]:
        return tf.io.gfile.GFile(self.path, mode)
