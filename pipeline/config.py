"""Where the stages run: the `[Executor]` and `[Docker]` sections of luigi.cfg.

Each section is named after its class, so luigi.cfg's `[Executor] kind = docker` and the command
line's `--Executor-kind=docker` set the same value.
"""

from __future__ import annotations

import luigi

from contract.containers import IMAGE_UID, ContainerSettings


class Executor(luigi.Config):
    """[Executor]: where the stages run."""

    kind = luigi.ChoiceParameter(
        default="local",
        choices=["local", "docker"],
        description="'local': stage commands run as local processes; 'docker': preprocess and "
        "evaluate each run in a container of [Docker] image, and the train launcher (still a "
        "local process) runs one container per worker (`--backend docker`).",
    )


class Docker(luigi.Config):
    """[Docker]: how the `docker` executor runs containers."""

    image = luigi.Parameter(
        default="nightly-trainer:latest",
        description="The stages' image (docker/build_image.sh builds it).",
    )
    mounts = luigi.ListParameter(
        default=("runs", ".cache"),
        description="Local folders (relative to the working folder) mounted at the same "
        "absolute path; ':ro' appended mounts read-only. Every path a stage reads or writes "
        "must lie in one of them.",
    )
    user = luigi.Parameter(
        default="",
        description="uid:gid the containers run as; empty for the invoking user's, or the "
        f"image's user ({IMAGE_UID}) when invoked as root.",
    )
    worker_port = luigi.IntParameter(
        default=2222,
        description="Port of each training worker on the cluster's private network.",
    )


def container_settings() -> ContainerSettings | None:
    """The containers' settings when `[Executor] kind = docker`, else None (local processes)."""
    if Executor().kind != "docker":
        return None
    config = Docker()
    return ContainerSettings(config.image, tuple(config.mounts), config.user)


def train_backend_flags() -> list[str]:
    """The flags that put `python -m train launch`'s workers where luigi.cfg says."""
    settings = container_settings()
    if settings is None:
        return []
    flags = ["--backend", "docker", "--image", settings.image]
    for mount in settings.mounts:
        flags += ["--docker-mount", mount]
    if settings.user:
        flags += ["--docker-user", settings.user]
    return flags + ["--worker-port", str(Docker().worker_port)]
