"""Shared pytest fixtures, and how `make test` shares the suite out over two processes."""

from __future__ import annotations

import os

import pytest

# Before anything imports TensorFlow: the stage's processes run like this (train/__init__.py),
# and in-process tests compare with them.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
# A test process runs in turn what the pipeline runs in processes of their own: Beam's runners
# leave gRPC's threads alive in it, and a later in-process launch forks its namespace holder
# from it. With gRPC's fork support on (its default) such a child may run gRPC's handlers
# between fork and exec, print, and die there; the stages themselves never fork beside a live
# gRPC.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from tests import gcs_emulator  # noqa: E402

# TensorFlow reads its gs:// settings at import: the test processes, and the fork servers they
# start, import it with the GCS emulator's, so that its clients' programs can be forked.
for _key, _value in gcs_emulator.TENSORFLOW_GCS_SETTINGS.items():
    os.environ.setdefault(_key, _value)

from contract import spawn  # noqa: E402
from contract.forkserver import ENV as FORKSERVER_ENV  # noqa: E402
from tests import factories  # noqa: E402
from tests import tiny_full_run as tiny  # noqa: E402

# Markers whose tests start clusters, luigi runs, containers or whole-dataset builds.
HEAVY_MARKERS = ("e2e", "docker", "slow")
# The Docker tests share the image (built once per process) and the engine's container names.
DOCKER_TESTS = "tests/docker/"


# Optional: `pytest -p no:xdist` runs the suite in one process without this hook.
@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`pytest -n N --dist loadfile`: whole files to one process, and tests/docker/ as one file.

    A file's tests share its module-scoped fixtures (one FullRun, one trained cluster) and
    some depend on the order they run in (a rerun after the first run), so a file never
    splits. xdist's own `loadgroup` cannot be used instead: it renames test ids, which
    this pytest no longer allows.
    """
    if config.getvalue("dist") != "loadfile":
        return None
    # In the order collected (heavy files first, see below), not by how many tests a file has:
    # a file of four long end-to-end tests would otherwise start last.
    config.option.loadscopereorder = False
    from xdist.scheduler import LoadFileScheduling

    class FilesAndDocker(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(DOCKER_TESTS):
                return DOCKER_TESTS
            return super()._split_scope(nodeid)

    return FilesAndDocker(config, log)


def pytest_collection_modifyitems(config, items):
    """Under xdist, files with heavy tests are handed out first, so that no long file is
    left to run alone at the end; a file's own tests keep their order."""
    if not hasattr(config, "workerinput"):
        return
    heavy_files = {
        item.nodeid.split("::", 1)[0]
        for item in items
        if any(item.get_closest_marker(name) for name in HEAVY_MARKERS)
    }
    items.sort(key=lambda item: item.nodeid.split("::", 1)[0] not in heavy_files)


@pytest.fixture
def shard_set(tmp_path):
    """A small two-worker shard set of real Fashion-MNIST images: (data_dir, manifest)."""
    data_dir = str(tmp_path / "data")
    return data_dir, factories.write_shard_set(data_dir)


@pytest.fixture(scope="session", autouse=True)
def fork_server(request):
    """One warm fork server per test process, when the session has end-to-end tests: every
    stage program the tests' runs start forks from it with TensorFlow and Beam imported
    (contract.spawn), as `make simulate`'s nights do, and so does a `python -m` program a test
    starts itself through tests/forked.py. TEST_FORKSERVER=0 starts each as a process of its
    own, as a night without a fork server does."""
    heavy = any(
        item.get_closest_marker(name) for item in request.session.items for name in HEAVY_MARKERS
    )
    if not heavy or os.environ.get("TEST_FORKSERVER", "1") == "0" or FORKSERVER_ENV in os.environ:
        yield None
        return
    with spawn.serving_this_process() as path:
        yield path


@pytest.fixture(scope="module", autouse=True)
def own_processes(request):
    """A test file that looks at its stages' processes (their command lines, who their parent
    is) sets OWN_PROCESSES = True: its programs start as processes of their own."""
    if not getattr(request.module, "OWN_PROCESSES", False) or FORKSERVER_ENV not in os.environ:
        yield
        return
    path = os.environ.pop(FORKSERVER_ENV)
    try:
        yield
    finally:
        os.environ[FORKSERVER_ENV] = path


@pytest.fixture(scope="session")
def tiny_full_run(tmp_path_factory) -> tiny.TinyFullRun:
    """The session's one tiny FullRun (tests/tiny_full_run.py), shared by every test process:
    under pytest-xdist it lives beside the processes' own temporary folders. Read only."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    return tiny.shared(base / "tiny-full-run")
