"""Where a stage's command runs: a local process (`local`) or a Docker container (`docker`).

A task builds its stage's command, `[python, "-m", stage, args...]`, and hands it to
`call(command, log)`; `[executor] kind` in luigi.cfg picks the place:

- `local` runs the command as a subprocess.
- `docker` runs `<image> <stage> args...` with the `[docker] mounts` bind-mounted at the same
  absolute paths and the working folder kept, so every path in the arguments and manifests
  means the same file inside and outside. `python -m train launch` stays a host process
  (the train stage's launcher and its whole-cluster restarts), but its workers become
  containers on a private network through `DockerWorkerBackend`, TF_CONFIG naming them.

Containers run as the invoking uid:gid, or, when that is root, as the image's non-root user
with the mounts handed to it (chown) so that it can write there.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import os
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING

import luigi

if TYPE_CHECKING:
    from train.config import TrainConfig

LABEL = "nightly-trainer"
IMAGE_UID = 1000  # the image's `trainer` user (docker/Dockerfile)
REMOVE_TIMEOUT_SECONDS = 30.0
STOP_GRACE_SECONDS = 10


class ExecutorError(RuntimeError):
    """A stage command cannot be run as configured."""


class ExecutorConfig(luigi.Config):
    """[executor]: where the stages run."""

    kind = luigi.ChoiceParameter(
        default="local",
        choices=["local", "docker"],
        config_path={"section": "executor", "name": "kind"},
        description="'local': stage commands run as subprocesses; 'docker': each runs in its "
        "own container of [docker] image, training as one container per worker.",
    )


class DockerConfig(luigi.Config):
    """[docker]: how the `docker` executor runs containers."""

    image = luigi.Parameter(
        default="nightly-trainer:latest",
        config_path={"section": "docker", "name": "image"},
        description="The stages' image (docker/build_image.sh builds it).",
    )
    mounts = luigi.ListParameter(
        default=("runs", ".cache"),
        config_path={"section": "docker", "name": "mounts"},
        description="Local folders (relative to the working folder) mounted at the same "
        "absolute path; ':ro' appended mounts read-only. Every path a stage reads or writes "
        "must lie in one of them.",
    )
    user = luigi.Parameter(
        default="",
        config_path={"section": "docker", "name": "user"},
        description="uid:gid the containers run as; empty for the invoking user's, or the "
        f"image's user ({IMAGE_UID}) when invoked as root.",
    )
    worker_port = luigi.IntParameter(
        default=2222,
        config_path={"section": "docker", "name": "worker_port"},
        description="Port of each training worker on the cluster's private network.",
    )


@dataclasses.dataclass(frozen=True)
class DockerSettings:
    """What a container needs besides its command: image, mounts, user and working folder."""

    image: str
    mounts: tuple[str, ...]
    user: str = ""
    worker_port: int = 2222
    workdir: str = dataclasses.field(default_factory=os.getcwd)

    @classmethod
    def from_config(cls) -> DockerSettings:
        config = DockerConfig()
        return cls(config.image, tuple(config.mounts), config.user, config.worker_port)

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
        """Creates the writable mounts and, as root, hands them to the containers' user."""
        uid, _, gid = self.resolved_user().partition(":")
        for path, read_only in self.volumes():
            if read_only:
                if not os.path.exists(path):
                    raise ExecutorError(f"read-only mount {path} does not exist; create it first")
                continue
            os.makedirs(path, exist_ok=True)
            if os.getuid() == 0 and uid.isdigit():
                _chown_tree(path, int(uid), int(gid or uid))

    def hand_over(self, path: str) -> None:
        """As root, gives `path` and its parents inside a writable mount to the containers' user.

        For folders this process creates after `prepare_volumes` (the train launcher's log
        folder creates the train folder too), so the containers can still write beside them.
        """
        uid, _, gid = self.resolved_user().partition(":")
        if os.getuid() != 0 or not uid.isdigit():
            return
        path = os.path.abspath(path)
        for mount, read_only in self.volumes():
            if read_only or os.path.commonpath([mount, path]) != mount:
                continue
            while True:
                os.chown(path, int(uid), int(gid or uid))
                if path == mount:
                    break
                path = os.path.dirname(path)
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
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, d) for d in dirs)]:
            os.chown(name, uid, gid)
        for name in files:
            os.lchown(os.path.join(root, name), uid, gid)


def split_stage_command(command: Sequence[str]) -> tuple[str, list[str]]:
    """(stage, args) of `[python, "-m", stage, args...]`.

    Raises:
        ExecutorError: the command is not a `python -m <stage>` command line.
    """
    if len(command) < 3 or command[1] != "-m":
        raise ExecutorError(
            f"expected a stage command [python, -m, stage, args...], got {list(command)[:4]}"
        )
    return command[2], list(command[3:])


class LocalExecutor:
    """Runs stage commands as local subprocesses."""

    kind = "local"

    def call(self, command: Sequence[str], log: IO[bytes]) -> int:
        """Runs `command`, its output appended to `log`; returns its exit code."""
        env = os.environ | {"TF_USE_LEGACY_KERAS": "1"}
        return subprocess.call(list(command), stdout=log, stderr=subprocess.STDOUT, env=env)


class DockerExecutor:
    """Runs each stage command in its own container; training as one container per worker."""

    kind = "docker"

    def __init__(self, settings: DockerSettings) -> None:
        self.settings = settings

    def call(self, command: Sequence[str], log: IO[bytes]) -> int:
        """Runs `command`'s stage in a container, output appended to `log`; returns its exit code.

        `python -m train launch ...` instead runs the train launcher on this machine with
        `DockerWorkerBackend`, so the launcher's restart logic drives the worker containers.
        """
        stage, args = split_stage_command(command)
        _require_docker()
        self.settings.prepare_volumes()
        if stage == "train" and args[:1] == ["launch"]:
            launcher = [sys.executable, "-c", _LAUNCH_SNIPPET, *self.settings_flags(), "--"]
            _note(log, f"train launcher here, its workers in containers of {self.settings.image}")
            env = os.environ | {"TF_USE_LEGACY_KERAS": "1"}
            return subprocess.call(
                launcher + args[1:], stdout=log, stderr=subprocess.STDOUT, env=env
            )
        name = f"{LABEL}-{stage}-{uuid.uuid4().hex[:8]}"
        docker_run = ["docker", "run", "--rm", "--init"]
        docker_run += self.settings.run_args(name, {"stage": stage}, {})
        docker_run += [self.settings.image, stage, *args]
        _note(log, shlex.join(docker_run))
        try:
            return subprocess.call(docker_run, stdout=log, stderr=subprocess.STDOUT)
        finally:
            # Normally gone already (--rm); still there if this process was interrupted.
            _docker_quiet("rm", "--force", name)

    def settings_flags(self) -> list[str]:
        flags = ["--image", self.settings.image, "--workdir", self.settings.workdir]
        flags += ["--user", self.settings.resolved_user()]
        flags += ["--worker-port", str(self.settings.worker_port)]
        for mount in self.settings.mounts:
            flags += ["--mount", mount]
        return flags


def executor_from_config() -> LocalExecutor | DockerExecutor:
    """The executor `[executor] kind` names."""
    if ExecutorConfig().kind == "docker":
        return DockerExecutor(DockerSettings.from_config())
    return LocalExecutor()


def call(command: Sequence[str], log: IO[bytes]) -> int:
    """Runs a stage command where luigi.cfg says, its output appended to `log`; its exit code.

    The tasks' one entry point: `executor.call(self.command(), log)` in place of
    `subprocess.call(self.command(), stdout=log, stderr=subprocess.STDOUT)`.
    """
    return executor_from_config().call(command, log)


def _note(log: IO[bytes], text: str) -> None:
    log.write(f"[executor docker] {text}\n".encode())
    log.flush()


def _require_docker() -> None:
    try:
        ok = subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        raise ExecutorError(
            "[executor] kind = docker but the Docker engine cannot be reached ('docker info' "
            "fails): start dockerd, or set [executor] kind = local"
        )


def _docker_quiet(*args: str) -> int:
    return subprocess.call(["docker", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _container_exists(name: str) -> bool:
    return _docker_quiet("container", "inspect", name) == 0


def _remove_container(name: str) -> None:
    """Removes `name` (running or not) and waits until its name is free again."""
    deadline = time.monotonic() + REMOVE_TIMEOUT_SECONDS
    while _container_exists(name):
        if time.monotonic() > deadline:
            raise ExecutorError(f"container {name} could not be removed; run 'docker rm -f {name}'")
        _docker_quiet("rm", "--force", name)
        time.sleep(0.2)


class DockerWorkerBackend:
    """The train launcher's `WorkerBackend` with each worker in its own container.

    Workers are `<prefix>-worker-<i>` on the private network `<prefix>-net`, where `<prefix>`
    derives from the train folder: a rerun after a crash finds and replaces what the crashed
    launcher left behind. Killing a worker container is a worker death like any other: the
    launcher stops all and restarts the whole cluster.
    """

    def __init__(
        self, settings: DockerSettings, worker_command: list[str], train_dir: str, log_dir: str
    ) -> None:
        self.settings = settings
        self.worker_command = worker_command
        self.train_dir = os.path.abspath(train_dir)
        self.log_dir = log_dir
        digest = hashlib.sha1(self.train_dir.encode()).hexdigest()[:10]
        self.prefix = f"{LABEL}-{digest}"
        self.network = f"{self.prefix}-net"
        self.clients: dict[int, subprocess.Popen[bytes]] = {}

    def container_name(self, worker_index: int) -> str:
        return f"{self.prefix}-worker-{worker_index}"

    def addresses(self, num_workers: int) -> list[str]:
        if _docker_quiet("network", "inspect", self.network) != 0:
            code = _docker_quiet(
                "network", "create", "--internal", "--label", f"{LABEL}=1", self.network
            )
            if code != 0 and _docker_quiet("network", "inspect", self.network) != 0:
                raise ExecutorError(f"could not create the docker network {self.network}")
        port = self.settings.worker_port
        return [f"{self.container_name(i)}:{port}" for i in range(num_workers)]

    def log_path(self, worker_index: int) -> str:
        return os.path.join(self.log_dir, f"worker-{worker_index}.log")

    def start(self, worker_index: int, tf_config_json: str, attempt: int) -> None:
        from train import cluster

        name = self.container_name(worker_index)
        _remove_container(name)
        os.makedirs(self.log_dir, exist_ok=True)
        os.makedirs(self.train_dir, exist_ok=True)
        self.settings.hand_over(self.log_dir)
        self.settings.hand_over(self.train_dir)
        env = {cluster.TF_CONFIG_ENV: tf_config_json, cluster.ATTEMPT_ENV: str(attempt)}
        labels = {"train-dir": self.train_dir, "worker": str(worker_index)}
        docker_run = ["docker", "run", "--init", "--network", self.network]
        docker_run += self.settings.run_args(name, labels, env)
        docker_run += [self.settings.image, *self.worker_command]
        with open(self.log_path(worker_index), "ab") as log_file:
            log_file.write(f"=== attempt {attempt} worker {worker_index} ({name}) ===\n".encode())
            log_file.flush()
            # The attached client exits with the container's exit code (137 when killed).
            self.clients[worker_index] = subprocess.Popen(
                docker_run, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def poll(self, worker_index: int) -> int | None:
        return self.clients[worker_index].poll()

    def terminate(self, worker_index: int) -> None:
        name = self.container_name(worker_index)
        client = self.clients.get(worker_index)
        if client is not None and client.poll() is None:
            _docker_quiet("stop", "--time", str(STOP_GRACE_SECONDS), name)
            try:
                client.wait(STOP_GRACE_SECONDS + 20)
            except subprocess.TimeoutExpired:
                client.kill()
                client.wait()
        _remove_container(name)

    def close(self) -> None:
        """Removes the containers and the network (after the launcher has stopped the workers)."""
        for index in list(self.clients):
            with contextlib.suppress(ExecutorError):
                _remove_container(self.container_name(index))
        _docker_quiet("network", "rm", self.network)


def _train_config_from_flags(flags: list[str]) -> TrainConfig:
    """Parses `python -m train launch`'s settings flags the way train's command line does."""
    from train.config import TrainConfig

    parser = argparse.ArgumentParser(prog="train launch (docker)")
    for field in dataclasses.fields(TrainConfig):
        flag = f"--{field.name.replace('_', '-')}"
        if field.default is dataclasses.MISSING:
            parser.add_argument(flag, required=True)
        else:
            parser.add_argument(flag, type=type(field.default), default=field.default)
    args = parser.parse_args(flags)
    return TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})


def launch_in_containers(argv: list[str]) -> int:
    """`python -m train launch` with worker containers: [docker flags] -- [launch flags]."""
    from contract import layout
    from contract.manifest import ManifestError
    from train import launcher
    from train.config import ConfigError

    parser = argparse.ArgumentParser(prog="pipeline.executor launch")
    parser.add_argument("--image", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--worker-port", type=int, required=True)
    parser.add_argument("--mount", action="append", default=[])
    split = argv.index("--") if "--" in argv else len(argv)
    ours = parser.parse_args(argv[:split])
    launch_parser = argparse.ArgumentParser(prog="train launch (docker)")
    launch_parser.add_argument("--num-workers", type=int, required=True)
    launch_parser.add_argument("--max-restarts", type=int, default=2)
    launch_parser.add_argument("--ports", default=None, help="ignored: each container has its own")
    launch_parser.add_argument("--log-dir", default=None)
    launch_args, config_flags = launch_parser.parse_known_args(argv[split + 1 :])
    settings = DockerSettings(
        ours.image, tuple(ours.mount), ours.user, ours.worker_port, ours.workdir
    )
    try:
        config = _train_config_from_flags(config_flags)
        log_dir = launch_args.log_dir or layout.join(config.train_dir, "logs")
        # The launcher's own worker command line, run by the image's python.
        worker_command = ["python", *launcher.worker_argv(config)[1:]]
        backend = DockerWorkerBackend(settings, worker_command, config.train_dir, log_dir)
        try:
            launcher.launch(
                config, launch_args.num_workers, launch_args.max_restarts, backend=backend
            )
        finally:
            backend.close()
    except (ConfigError, ManifestError) as e:  # bad input, as in train's own command line
        print(f"train: {e}", file=sys.stderr)
        return launcher.BAD_INPUT_EXIT_CODE
    except (launcher.LaunchError, ExecutorError) as e:
        print(f"train: {e}", file=sys.stderr)
        return 1
    return 0


# Run as `python -c` rather than `-m pipeline.executor`: the pipeline package imports this
# module itself, and runpy warns about running a module that is already imported.
_LAUNCH_SNIPPET = (
    "import sys; from pipeline.executor import launch_in_containers; "
    "sys.exit(launch_in_containers(sys.argv[1:]))"
)


def run_stage(stage: str, command: Sequence[str], log_path: str) -> None:
    """Runs a stage's command through the configured executor, logging to `log_path`.

    Raises:
        RuntimeError: the stage exited non-zero; the message names its log and ends with its tail.
    """
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"$ {shlex.join(command)}\n".encode())
        log.flush()
        returncode = call(command, log)
    if returncode != 0:
        raise RuntimeError(
            f"the {stage} stage exited with {returncode}; its log is {log_path}:\n"
            + log_tail(log_path)
        )


def log_tail(path: str, lines: int = 20) -> str:
    """The last lines of a log file, for an error message."""
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])
