"""The stage on a real Dask cluster (a scheduler and two worker processes on 127.0.0.1):
byte-identical to the DirectRunner, with the project's code shipped to the workers."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from contract import layout, manifest
from preprocess import dask_cluster, run_preprocess
from tests import factories, forked
from tests.preprocess.conftest import tiny_config
from tests.preprocess.test_stage import data_dir_of, file_bytes

pytestmark = pytest.mark.slow

# Fields that name the run rather than its content.
RUN_FIELDS = ("created_utc", "code_version")


def comparable(data_dir: str) -> dict:
    with open(os.path.join(data_dir, layout.MANIFEST_FILE)) as f:
        doc = json.load(f)
    for field in RUN_FIELDS:
        doc.pop(field)
    doc["parameters"].pop("output_root")
    return doc


@pytest.fixture(scope="module")
def direct(tiny_tfds, tiny_sources, tmp_path_factory):
    """The DirectRunner's shard set that each Dask run must match, built once; its config."""
    output_root = str(tmp_path_factory.mktemp("direct") / "runs")
    config = tiny_config(tiny_tfds, tiny_sources, output_root=output_root, max_records_per_file=40)
    run_preprocess(config)
    return config


def _on_dask_and_flags(make_config):
    """The config and stage flags of the direct run's shard set, on Dask."""
    on_dask = make_config(max_records_per_file=40)
    flags = [
        f"--{name}={value}"
        for name, value in dataclasses.asdict(on_dask).items()
        if value is not None and not isinstance(value, bool)
    ]
    return on_dask, flags


def test_cluster_command_serves_a_byte_identical_run_and_stops_its_own_processes(
    make_config, direct, tmp_path
):
    # One cluster, started and stopped through the command a user runs, serves the run: its
    # output must be the DirectRunner's, byte for byte, computed by the code the client shipped.
    state_dir = str(tmp_path / "dask")
    run = [sys.executable, "-m", "preprocess.dask_cluster"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*run, *args, "--state-dir", state_dir],
            capture_output=True, text=True, timeout=180, cwd=factories.PROJECT_ROOT, env=env,
        )  # fmt: skip

    started = cli("start", "--workers", "2")
    pids: list[int] = []
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        address = started.stdout.strip().splitlines()[-1]
        assert address.startswith("tcp://127.0.0.1:")
        with open(os.path.join(state_dir, dask_cluster.STATE_FILE)) as f:
            state = json.load(f)
        pids = [state["scheduler_pid"], *state["worker_pids"]]
        status = cli("status")
        assert status.stdout.strip() == f"{address} with 2 workers"
        again = cli("start", "--workers", "2")
        assert again.returncode == 1 and f"runs at {address}: stop it first" in again.stderr
        _assert_run_on_cluster_matches_direct(make_config, direct, address)
    finally:
        stopped = cli("stop")
    assert stopped.returncode == 0 and stopped.stdout.startswith("stopped 3 processes")
    # Every process it started is gone (or a zombie), the workers too.
    assert len(pids) == 3
    assert not [pid for pid in pids if dask_cluster._alive_as_started(pid, "")], "processes left"
    assert cli("status").returncode == 1
    bad = cli("start", "--workers", "0")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --workers must be at least 1")


def _assert_run_on_cluster_matches_direct(make_config, direct, address: str) -> None:
    """Runs the stage on the cluster at `address`; checks what it published and who ran it."""
    on_dask, flags = _on_dask_and_flags(make_config)
    args = [sys.executable, "-m", "preprocess", "run", *flags, "--runner=DaskRunner",
            f"--dask_client_address={address}"]  # fmt: skip
    result = forked.run(args, env=os.environ, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    a, b = file_bytes(data_dir_of(direct)), file_bytes(data_dir_of(on_dask))
    assert len(a) == 12 and a == b  # 4 workers x 2 files + 1 validation + 3 eval files
    assert comparable(data_dir_of(direct)) == comparable(data_dir_of(on_dask))
    # Nothing but the shard set was published: no buckets, temporary or Beam files.
    published = sorted(
        os.path.relpath(os.path.join(root, name), data_dir_of(on_dask))
        for root, _, names in os.walk(data_dir_of(on_dask))
        for name in names
    )
    assert published == sorted([*a, layout.MANIFEST_FILE, manifest.STATISTICS_FILE])
    assert sorted(os.listdir(os.path.dirname(data_dir_of(on_dask)))) == ["data"]
    # The workers ran the code the client shipped, not a copy they found on their own.
    from distributed import Client

    with Client(address, timeout=30) as client:
        where = client.run(lambda: __import__("preprocess.transforms").transforms.__file__)
    assert len(where) == 2
    assert all(".zip" in path and "nightly_trainer_code_" in path for path in where.values())


def test_a_dask_run_without_an_address_gets_its_own_cluster_and_the_same_bytes(make_config, direct):
    # The run starts a loopback LocalCluster in its own process and ships the code to its
    # workers only; the shard set is still the DirectRunner's, byte for byte.
    on_dask, flags = _on_dask_and_flags(make_config)
    args = [sys.executable, "-m", "preprocess", "run", *flags, "--runner=DaskRunner"]
    result = forked.run(args, env=os.environ, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "a local Dask cluster at tcp://127.0.0.1:" in result.stderr
    assert file_bytes(data_dir_of(direct)) == file_bytes(data_dir_of(on_dask))
