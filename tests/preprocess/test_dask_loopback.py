"""Every socket a Dask cluster of the preprocess stage listens on, dashboards included, is on
loopback: the dashboard has no authentication."""

from __future__ import annotations

import contextlib
import sys

import psutil

from preprocess import dask_cluster, dask_support

LOOPBACK = {"127.0.0.1", "::1"}


def _listening(pids: list[int]) -> set[str]:
    """host:port of every TCP socket the processes (and their children) listen on."""
    processes = [psutil.Process(pid) for pid in pids]
    processes += [child for p in list(processes) for child in p.children(recursive=True)]
    return {
        f"{c.laddr.ip}:{c.laddr.port}"
        for p in processes
        for c in p.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }


def _exposed(addresses: set[str]) -> set[str]:
    return {a for a in addresses if a.rsplit(":", 1)[0] not in LOOPBACK}


def test_the_cluster_command_listens_on_loopback_only(tmp_path):
    state_dir = str(tmp_path / "dask")
    state = dask_cluster.start(workers=1, state_dir=state_dir)
    try:
        listening = _listening([state["scheduler_pid"], *state["worker_pids"]])
    finally:
        dask_cluster.stop(state_dir)
    assert len(listening) >= 3  # scheduler, its dashboard, the worker (and its dashboard)
    assert _exposed(listening) == set()


def test_the_dask_runner_without_an_address_gets_a_loopback_cluster():
    with contextlib.ExitStack() as cleanup:
        args = dask_support.prepare(["--runner=DaskRunner"], 1000, 100, cleanup)
        address = [a for a in args if a.startswith("--dask_client_address=")]
        assert address and address[0].startswith("--dask_client_address=tcp://127.0.0.1:")
        listening = _listening([psutil.Process().pid])
    assert len(listening) >= 2  # the scheduler and its dashboard, in this process
    assert _exposed(listening) == set()
    # The code went to the workers only: this process (the scheduler's) keeps its own, and
    # no path into the cluster's removed scratch folder is left for later imports to fail on.
    assert not [p for p in sys.path if "nightly_trainer_code_" in p]
