"""Local training workers are reachable from their own cluster only: no gRPC port of theirs
listens on any address of the host while they train."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import subprocess
import sys

import pytest

from tests.factories import PROJECT_ROOT
from tests.train.conftest import launch_argv, train_env, write_small_shard_set
from tests.waiting import wait_until
from train.cluster import HOLD_ENV
from train.config import ConfigError, TrainConfig
from train.local_backend import free_ports, private_network_for
from train.private_network import NamespaceUnavailable, PrivateNetwork

# The workers are found by their command lines here (conftest.own_processes).
OWN_PROCESSES = True
TCP_LISTEN = "0A"


def _listening(tables: list[str], port: int) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} shows them) listening on `port`."""
    found = []
    for table in tables:
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                address, hex_port = fields[1].rsplit(":", 1)
                if int(hex_port, 16) == port and fields[3] == TCP_LISTEN:
                    found.append(address)
    return found


def _host_addresses() -> list[str]:
    """The host's IPv4 addresses on interfaces other than loopback."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    addresses = [line.split()[3].split("/")[0] for line in out.splitlines()]
    return [a for a in addresses if not a.startswith("127.")]


def _refused(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        code = s.connect_ex((address, port))
    return code == errno.ECONNREFUSED


def _worker_pids(train_dir: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"worker" in argv and train_dir.encode() in argv and b"train" in argv:
            pids.append(int(entry))
    return pids


def _can_isolate() -> bool:
    try:
        PrivateNetwork.create().close()
    except NamespaceUnavailable:
        return False
    return True


@pytest.mark.e2e
@pytest.mark.skipif(not _host_addresses(), reason="the host has no address besides loopback")
@pytest.mark.skipif(not _can_isolate(), reason="this machine cannot make network namespaces")
def test_training_ports_are_unreachable_from_the_host(tmp_path):
    data_dir, train_dir = str(tmp_path / "data"), str(tmp_path / "train")
    write_small_shard_set(data_dir)
    ports = free_ports(2)
    argv = launch_argv(data_dir, train_dir, epochs=2, save_freq_steps=1000)
    argv += ["--ports", ",".join(map(str, ports))]
    # The workers wait at step 3 until they are stopped: the ports are checked while they
    # train, on a machine of any speed.
    launch = subprocess.Popen(
        argv,
        cwd=PROJECT_ROOT,
        env=train_env(**{HOLD_ENV: "3"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    seen: dict[int, list[str]] = {}

    def both_listen() -> bool:
        for pid in _worker_pids(train_dir):  # each sees its network's listening sockets
            tables = [f"/proc/{pid}/net/tcp", f"/proc/{pid}/net/tcp6"]
            for index, port in enumerate(ports):
                with contextlib.suppress(OSError):  # the worker may have just exited
                    if addresses := _listening(tables, port):
                        seen[index] = addresses
        return len(seen) == 2

    try:
        wait_until(
            both_listen,
            timeout=240,
            alive=lambda: launch.poll() is None,
            failure=lambda: f"the workers never listened: {launch.poll()} {seen}",
        )
        # The workers do listen on their ports (on every address of their own network) ...
        host_tables = ["/proc/self/net/tcp", "/proc/self/net/tcp6"]
        for port in ports:
            # ... but nothing on the host does, and a connection to any host address is refused.
            assert _listening(host_tables, port) == []
            for address in [*_host_addresses(), "127.0.0.1"]:
                assert _refused(address, port), f"{address}:{port} accepts connections"
        assert launch.poll() is None, "the run ended before the ports were checked"
    finally:
        launch.kill()
        launch.wait()


def test_a_remote_run_keeps_the_host_network_only_when_allowed(caplog):
    data = "gs://bucket/runs/2026-01-31/data"
    with pytest.raises(ConfigError, match="cannot reach gs://bucket/runs/2026-01-31/data: pass"):
        private_network_for(TrainConfig(data_dir=data, train_dir="/tmp/train"))
    allowed = TrainConfig(data_dir=data, train_dir="/tmp/train", allow_host_network=True)
    with caplog.at_level(logging.WARNING, logger="train.launcher"):
        assert private_network_for(allowed) is None
    assert data in caplog.text and "listen on every interface" in caplog.text


def test_no_namespace_stops_the_run_unless_the_host_network_is_allowed(monkeypatch, caplog):
    def unavailable() -> None:
        raise NamespaceUnavailable("unshare --user --net failed: Operation not permitted")

    monkeypatch.setattr(PrivateNetwork, "create", unavailable)
    with pytest.raises(ConfigError, match=r"Operation not permitted\): pass --allow-host-network"):
        private_network_for(TrainConfig(data_dir="/data", train_dir="/train"))
    allowed = TrainConfig(data_dir="/data", train_dir="/train", allow_host_network=True)
    with caplog.at_level(logging.WARNING, logger="train.launcher"):
        assert private_network_for(allowed) is None
    assert "no private network namespace" in caplog.text


def test_the_namespace_cannot_reach_the_hosts_loopback():
    # Why a gs:// run (or its emulator on the host's loopback) cannot train isolated.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    network = PrivateNetwork.create()
    try:
        probe = (
            "import socket, sys\n"
            f"try: socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
            "except OSError: sys.exit(7)\n"
        )
        proc = subprocess.run([sys.executable, "-c", probe], preexec_fn=network.enter)
        assert proc.returncode == 7
        host = subprocess.run([sys.executable, "-c", probe])
        assert host.returncode == 0  # the same probe on the host's network connects
    finally:
        network.close()
        server.close()
