"""The Luigi target of every stage's output: one file wherever `tf.io.gfile` reaches.

`GFileTarget` works the same on a local path and on gs:// (the stages write through
tf.io.gfile too), so completeness, reruns and `--force-stage` behave alike on both.
A `luigi.LocalTarget` would never exist for a gs:// path.
"""

from __future__ import annotations

from typing import IO, Any

import luigi
import luigi.target

from contract import gfile


class GFileSystem(luigi.target.FileSystem):
    """Luigi's FileSystem interface over `tf.io.gfile` (local paths and gs://)."""

    def exists(self, path: str) -> bool:
        return bool(gfile.exists(path))

    def remove(self, path: str, recursive: bool = True, skip_trash: bool = True) -> None:
        if gfile.isdir(path):
            if not recursive:
                raise luigi.target.FileSystemException(f"{path} is a folder: pass recursive")
            gfile.rmtree(path)
        elif gfile.exists(path):
            gfile.remove(path)

    def mkdir(self, path: str, parents: bool = True, raise_if_exists: bool = False) -> None:
        if raise_if_exists and gfile.exists(path):
            raise luigi.target.FileAlreadyExists(path)
        gfile.makedirs(path)

    def isdir(self, path: str) -> bool:
        return bool(gfile.isdir(path))

    def listdir(self, path: str) -> list[str]:
        return [f"{path.rstrip('/')}/{name.rstrip('/')}" for name in gfile.listdir(path)]

    def move(self, path: str, dest: str, raise_if_exists: bool = False) -> None:
        gfile.rename(path, dest, overwrite=not raise_if_exists)


class GFileTarget(luigi.target.FileSystemTarget):
    """A stage's completion marker (manifest, history, metrics) on a local path or gs://."""

    fs = GFileSystem()

    def open(self, mode: str = "r") -> IO[Any]:
        return gfile.GFile(self.path, mode)
