"""The launcher's container backend: one Docker container per worker on a private network.

`python -m train launch --backend docker --image IMG` keeps the launcher (and its whole-cluster
restarts) on this machine and starts each worker as `<prefix>-worker-<i>` on the network
`<prefix>-net`, TF_CONFIG naming the containers. `<prefix>` derives from the train folder, so a
rerun after a crash finds and replaces what a crashed launcher left behind.

No container outlives the launcher. A normal end, an exception or SIGTERM stops and removes
them (`close`). For a launcher killed outright (SIGKILL, or its parent dying), a reaper started
in its own session waits on a pipe only the launcher holds: the kernel closes the pipe when
the launcher dies, however it dies, and the reaper then removes every container of this launch
(`docker rm -f` by label) and the network. The attached `docker run` clients also get SIGTERM
when the launcher dies (parent-death signal), which they forward to their containers.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import signal
import subprocess
import uuid

from contract import processes
from contract.containers import (
    LABEL,
    ContainerError,
    ContainerSettings,
    docker_quiet,
    remove_container,
    require_docker,
)
from train import cluster

REAPER_WAIT_SECONDS = 60.0
# Runs in its own session: blocks until the launcher's end of its stdin pipe closes, then
# removes this launch's containers ($1: a label filter) and the network ($2).
REAPER_SCRIPT = (
    'cat >/dev/null; ids=$(docker ps -aq --filter "label=$1"); '
    '[ -z "$ids" ] || docker rm -f $ids >/dev/null 2>&1; '
    'docker network rm "$2" >/dev/null 2>&1; exit 0'
)


class DockerWorkerBackend:
    """The train launcher's `WorkerBackend` with each worker in its own container.

    Killing a worker container is a worker death like any other: the launcher stops all and
    restarts the whole cluster.
    """

    def __init__(
        self,
        settings: ContainerSettings,
        worker_port: int,
        worker_command: list[str],
        train_dir: str,
        log_dir: str,
    ) -> None:
        self.settings = settings
        self.worker_port = worker_port
        self.worker_command = worker_command
        self.train_dir = os.path.abspath(train_dir)
        self.log_dir = log_dir
        digest = hashlib.sha1(self.train_dir.encode()).hexdigest()[:10]
        self.prefix = f"{LABEL}-{digest}"
        self.network = f"{self.prefix}-net"
        self.launch_id = uuid.uuid4().hex[:12]
        self.clients: dict[int, subprocess.Popen[bytes]] = {}
        self._reaper: subprocess.Popen[bytes] | None = None
        self._reaper_pipe: int | None = None

    def container_name(self, worker_index: int) -> str:
        return f"{self.prefix}-worker-{worker_index}"

    def open(self) -> None:
        """Checks the engine, prepares the mounts, starts the reaper; once, before any worker.

        Raises:
            ContainerError: no Docker engine, or a read-only mount is missing.
        """
        if self._reaper is not None:
            return
        require_docker("--backend docker", "use --backend local")
        self.settings.prepare_volumes()
        read_end, self._reaper_pipe = os.pipe()  # both ends non-inheritable
        try:
            self._reaper = subprocess.Popen(
                ["sh", "-c", REAPER_SCRIPT, "reaper", f"{LABEL}.launch={self.launch_id}"]
                + [self.network],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # outlives a kill of the launcher's process group
            )
        finally:
            os.close(read_end)
        print(
            f"workers run in containers of {self.settings.image} on network {self.network} "
            f"(launch {self.launch_id})",
            flush=True,
        )

    def addresses(self, num_workers: int) -> list[str]:
        self.open()
        if docker_quiet("network", "inspect", self.network) != 0:
            code = docker_quiet(
                "network", "create", "--internal", "--label", f"{LABEL}=1", self.network
            )
            if code != 0 and docker_quiet("network", "inspect", self.network) != 0:
                raise ContainerError(f"could not create the docker network {self.network}")
        return [f"{self.container_name(i)}:{self.worker_port}" for i in range(num_workers)]

    def log_path(self, worker_index: int) -> str:
        return os.path.join(self.log_dir, f"worker-{worker_index}.log")

    def start(self, worker_index: int, tf_config_json: str, attempt: int) -> None:
        name = self.container_name(worker_index)
        remove_container(name)
        os.makedirs(self.log_dir, exist_ok=True)
        os.makedirs(self.train_dir, exist_ok=True)
        self.settings.hand_over(self.log_dir)
        self.settings.hand_over(self.train_dir)
        env = {k: v for k, v in os.environ.items() if k.startswith(cluster.FAULT_ENV_PREFIX)}
        env |= {cluster.TF_CONFIG_ENV: tf_config_json, cluster.ATTEMPT_ENV: str(attempt)}
        labels = {
            "train-dir": self.train_dir,
            "worker": str(worker_index),
            "launch": self.launch_id,
        }
        docker_run = ["docker", "run", "--init", "--network", self.network]
        docker_run += self.settings.run_args(name, labels, env)
        docker_run += [self.settings.image, *self.worker_command]
        with open(self.log_path(worker_index), "ab") as log_file:
            log_file.write(f"=== attempt {attempt} worker {worker_index} ({name}) ===\n".encode())
            log_file.flush()
            # The attached client exits with the container's exit code (137 when killed).
            self.clients[worker_index] = subprocess.Popen(
                docker_run,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # The client forwards SIGTERM to its container (sig-proxy): stops the worker.
                preexec_fn=processes.signal_when_parent_dies(signal.SIGTERM),
            )

    def poll(self, worker_index: int) -> int | None:
        return self.clients[worker_index].poll()

    def terminate(self, worker_index: int, grace_seconds: float) -> None:
        name = self.container_name(worker_index)
        client = self.clients.get(worker_index)
        if client is not None and client.poll() is None:
            docker_quiet("stop", "--time", str(math.ceil(grace_seconds)), name)
            try:
                client.wait(grace_seconds + 20)
            except subprocess.TimeoutExpired:
                client.kill()
                client.wait()
        remove_container(name)

    def close(self) -> None:
        """Removes the containers and the network (after the launcher has stopped the workers)."""
        for index in list(self.clients):
            with contextlib.suppress(ContainerError):
                remove_container(self.container_name(index))
        if self._reaper is None:
            return
        docker_quiet("network", "rm", self.network)
        if self._reaper_pipe is not None:
            os.close(self._reaper_pipe)  # the reaper finds nothing left and exits
            self._reaper_pipe = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._reaper.wait(REAPER_WAIT_SECONDS)
