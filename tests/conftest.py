"""Shared pytest fixtures, and how `make test` shares the suite out over two processes."""

from __future__ import annotations

import os

import pytest

# Before anything imports TensorFlow: the stage's processes run like this (train/__init__.py),
# and in-process tests compare with them.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

from tests import factories  # noqa: E402

# Markers whose tests start clusters, luigi runs, containers or whole-dataset builds.
HEAVY_MARKERS = ("e2e", "docker", "slow")
# The Docker tests share the image (built once per process) and the engine's container names.
DOCKER_TESTS = "tests/docker/"


@pytest.hookimpl(tryfirst=True)
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
