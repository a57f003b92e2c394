"""The output root's filesystem, which a fault fills (a tmpfs, or a file-size limit)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys

TMPFS = "tmpfs"
RLIMIT = "RLIMIT_FSIZE"
# What a full filesystem still has free: less than a night's shard set, enough for the ledger's
# record and the alerts' file, as a disk that fills up during the night leaves.
HEADROOM_BYTES = 256 * 1024
# Without a tmpfs: no file of the night may grow past what the ledger already holds plus this.
RLIMIT_MARGIN_BYTES = 256 * 1024
# Sets the file-size limit, then becomes the night's command (argv[1] is the limit).
_RLIMIT_EXEC = (
    "import os, resource, sys; n = int(sys.argv[1]); "
    "resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); os.execv(sys.argv[2], sys.argv[2:])"
)


@dataclasses.dataclass
class Disk:
    """Where the output root lives and how the simulation fills it.

    Attributes:
        path: the folder holding the output root (a tmpfs mount point, or a plain folder).
        kind: TMPFS or RLIMIT.
        note: how it was set up, or why there is no tmpfs.
        size_bytes: the tmpfs's size when it is not full.
        limit_bytes: while full under RLIMIT, the largest a file may grow; else None.
    """

    path: str
    kind: str
    note: str
    size_bytes: int = 0
    limit_bytes: int | None = None

    def used_bytes(self) -> int:
        stat = os.statvfs(self.path)
        return (stat.f_blocks - stat.f_bfree) * stat.f_frsize

    def fill(self, ledger_path: str) -> str:
        """Leaves the output root no room for a night; returns what was done, in words."""
        if self.kind == TMPFS:
            size = self.used_bytes() + HEADROOM_BYTES
            _mount("-o", f"remount,size={size}", self.path)
            return f"tmpfs shrunk to {size} bytes ({HEADROOM_BYTES} free)"
        held = os.path.getsize(ledger_path) if os.path.exists(ledger_path) else 0
        self.limit_bytes = held + RLIMIT_MARGIN_BYTES
        return f"RLIMIT_FSIZE {self.limit_bytes} bytes for the night's processes"

    def free(self) -> None:
        """Gives the output root its room back."""
        if self.kind == TMPFS:
            _mount("-o", f"remount,size={self.size_bytes}", self.path)
        self.limit_bytes = None

    def command(self, command: list[str]) -> list[str]:
        """`command`, under the file-size limit while the disk is full under RLIMIT."""
        if self.limit_bytes is None:
            return command
        return [sys.executable, "-c", _RLIMIT_EXEC, str(self.limit_bytes), *command]

    def release(self, keep_as: str) -> str:
        """Unmounts a tmpfs, copying the output root to `keep_as` first.

        Returns:
            Where the output root is now.
        """
        output_root = os.path.join(self.path, "runs")
        if self.kind != TMPFS:
            return output_root
        if os.path.isdir(output_root):
            shutil.copytree(output_root, keep_as, symlinks=True)
        subprocess.run(["umount", self.path], check=True, capture_output=True)
        os.rmdir(self.path)
        return keep_as


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"mount {' '.join(args)} failed: {done.stderr.strip()}")


def prepare(path: str, size_mb: int, tmpfs: bool = True) -> Disk:
    """Mounts a tmpfs of `size_mb` at `path`, or, where that is not allowed (or not `tmpfs`),
    makes `path` a plain folder whose nights get a file-size limit instead."""
    os.makedirs(path, exist_ok=True)
    size = size_mb * 1024 * 1024
    if not tmpfs:
        return Disk(path, RLIMIT, "no tmpfs (--no-tmpfs); a full disk is a file-size limit")
    try:
        _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", path)
    except OSError as e:
        return Disk(path, RLIMIT, f"no tmpfs ({e}); a full disk is a file-size limit")
    return Disk(path, TMPFS, f"a {size_mb} MiB tmpfs at {path}", size_bytes=size)


def folder_bytes(path: str) -> int:
    """The apparent size of every file under `path` (0 when it does not exist)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except FileNotFoundError:  # removed while walking
                continue
    return total
