"""A stage command as a `docker run` of the stages' image (preprocess and evaluate)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from contract import run_lock
from contract.containers import LABEL, ContainerSettings, docker_quiet, require_docker


class StageCommandError(ValueError):
    """A command is not a `python -m <stage> ...` command line."""


def split_stage_command(command: Sequence[str]) -> tuple[str, list[str]]:
    """(stage, args) of `[python, "-m", stage, args...]`.

    Raises:
        StageCommandError: the command is not a `python -m <stage>` command line.
    """
    if len(command) < 3 or command[1] != "-m":
        raise StageCommandError(
            f"expected a stage command [python, -m, stage, args...], got {list(command)[:4]}"
        )
    return command[2], list(command[3:])


def container_command(command: Sequence[str], settings: ContainerSettings) -> tuple[list[str], str]:
    """The `docker run` command line running `command`'s stage, and the container's name.

    The container is attached (its output is the client's), removed when it ends (`--rm`), and
    gets a SIGTERM that reaches the stage (`--init`) when the client gets one.

    Raises:
        ContainerError: no Docker engine, or a read-only mount is missing.
        StageCommandError: `command` is not a stage command.
    """
    stage, args = split_stage_command(command)
    require_docker("[Executor] kind = docker", "set [Executor] kind = local")
    settings.prepare_volumes()
    name = f"{LABEL}-{stage}-{uuid.uuid4().hex[:8]}"
    docker_run = ["docker", "run", "--rm", "--init", "--sig-proxy=true"]
    # The lock of the date is held here, by the client's parent: a container cannot inherit it.
    docker_run += settings.run_args(name, {"stage": stage}, {run_lock.HELD_OUTSIDE_ENV: "1"})
    return [*docker_run, settings.image, stage, *args], name


def remove_container_quietly(name: str) -> None:
    """Removes a stage container if it is still there (its client was interrupted)."""
    docker_quiet("rm", "--force", name)
