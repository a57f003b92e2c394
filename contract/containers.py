"""How every container of the stages' image is run: mounts at their own paths, user, labels.

Shared by the pipeline (a stage in one `docker run`) and the train launcher (one container per
worker), so both keep the same conventions: each mount appears at the same absolute path inside
and outside, the working folder is kept, so every path in the arguments and manifests means the
same file. Containers run as the invoking uid:gid or, when that is root, as the image's non-root
user with the mounts handed to it (chown, never through a symbolic link) so that it can
write there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
import subprocess
import time

LABEL = "nightly-trainer"
IMAGE_UID = 1000  # the image's `trainer` user (docker/Dockerfile)
REMOVE_TIMEOUT_SECONDS = 30.0


class ContainerError(RuntimeError):
    """A container cannot be run as configured."""


@dataclasses.dataclass(frozen=True)
class ContainerSettings:
    """What a container needs besides its command: image, mounts, user and working folder."""

    image: str
    mounts: tuple[str, ...]
    user: str = ""
    workdir: str = dataclasses.field(default_factory=os.getcwd)

    def resolved_user(self) -> str:
        if self.user:
            return self.user
        if os.getuid() == 0:
            return f"{IMAGE_UID}:{IMAGE_UID}"
        return f"{os.getuid()}:{os.getgid()}"

    def volumes(self) -> list[tuple[str, bool]]:
        """(absolute host path, read_only) of every local mount; gs:// and the like are skipped."""
        result = []
        for entry in self.mounts:
            path, read_only = (entry[:-3], True) if entry.endswith(":ro") else (entry, False)
            if "://" in path:
                continue
            result.append((os.path.abspath(os.path.join(self.workdir, path)), read_only))
        return result

    def prepare_volumes(self) -> None:
        """Creates the writable mounts and, as root, hands them to the containers' user.

        Raises:
            ContainerError: a read-only mount does not exist.
        """
        uid, _, gid = self.resolved_user().partition(":")
        for path, read_only in self.volumes():
            if read_only:
                if not os.path.exists(path):
                    raise ContainerError(f"read-only mount {path} does not exist; create it first")
                continue
            os.makedirs(path, exist_ok=True)
            if os.getuid() == 0 and uid.isdigit():
                _chown_tree(path, int(uid), int(gid or uid))

    def hand_over(self, path: str) -> None:
        """As root, gives `path` and its parents inside a writable mount to the containers' user.

        For folders created after `prepare_volumes` (the train launcher's log folder creates
        the train folder too), so the containers can still write beside them. A symbolic link
        on the way down from the mount (a container may have planted one) ends the walk: what
        it leads to is not the run's.
        """
        uid, _, gid = self.resolved_user().partition(":")
        if os.getuid() != 0 or not uid.isdigit():
            return
        path = os.path.abspath(path)
        for mount, read_only in self.volumes():
            if read_only or os.path.commonpath([mount, path]) != mount:
                continue
            parts = os.path.relpath(path, mount).split(os.sep) if path != mount else []
            _chown_folders(os.path.realpath(mount), parts, int(uid), int(gid or uid))
            return

    def run_args(self, name: str, labels: dict[str, str], env: dict[str, str]) -> list[str]:
        """`docker run` options shared by stage and worker containers."""
        args = ["--name", name, "--user", self.resolved_user(), "--workdir", self.workdir]
        for path, read_only in self.volumes():
            args += ["--volume", f"{path}:{path}{':ro' if read_only else ''}"]
        # An arbitrary uid has no home in the image; TF, TFDS and matplotlib want one.
        for key, value in {"HOME": "/tmp", "MPLCONFIGDIR": "/tmp/matplotlib", **env}.items():
            args += ["--env", f"{key}={value}"]
        args += ["--label", f"{LABEL}=1"]
        for key, value in labels.items():
            args += ["--label", f"{LABEL}.{key}={value}"]
        return args


def _chown_tree(path: str, uid: int, gid: int) -> None:
    """Gives every folder and file under `path` to uid:gid, never following a symbolic link.

    A link inside a mount may have been planted by a container (which writes there as another
    user): following it would hand whatever it names on the host to that user. The walk goes
    by folder descriptors (`os.fwalk`), so a folder swapped for a link while it runs is not
    followed either; links themselves are left as they are.
    """
    for _, _, files, root_fd in os.fwalk(os.path.realpath(path), follow_symlinks=False):
        os.chown(root_fd, uid, gid)  # each folder as it is entered: links to folders are not
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                if not stat.S_ISLNK(os.stat(name, dir_fd=root_fd, follow_symlinks=False).st_mode):
                    os.chown(name, uid, gid, dir_fd=root_fd, follow_symlinks=False)


def _chown_folders(top: str, parts: list[str], uid: int, gid: int) -> None:
    """Gives `top` and each folder of `parts` below it, in turn, to uid:gid.

    Each folder is opened from its parent's descriptor without following links, so a link
    anywhere on the way (or a folder swapped for one meanwhile) ends the walk there.
    """
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.chown(fd, uid, gid)
        for part in parts:
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:  # a link (ELOOP), not a folder (ENOTDIR) or not there (ENOENT)
                return
            os.close(fd)
            fd = child
            os.chown(fd, uid, gid)
    finally:
        os.close(fd)


def require_docker(what: str, way_out: str) -> None:
    """Checks that the Docker engine answers.

    Args:
        what: the setting that asked for containers, named in the error.
        way_out: how to run without containers instead.

    Raises:
        ContainerError: `docker info` fails.
    """
    try:
        ok = subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        raise ContainerError(
            f"{what} but the Docker engine cannot be reached ('docker info' fails): start "
            f"dockerd, or {way_out}"
        )


def docker_quiet(*args: str) -> int:
    """Runs `docker args...` without output; its exit code."""
    return subprocess.call(["docker", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def remove_container(name: str) -> None:
    """Removes `name` (running or not) and waits until its name is free again.

    Raises:
        ContainerError: the container is still there after REMOVE_TIMEOUT_SECONDS.
    """
    deadline = time.monotonic() + REMOVE_TIMEOUT_SECONDS
    while docker_quiet("container", "inspect", name) == 0:
        if time.monotonic() > deadline:
            raise ContainerError(
                f"container {name} could not be removed; run 'docker rm -f {name}'"
            )
        docker_quiet("rm", "--force", name)
        time.sleep(0.2)
