"""Shared pytest fixtures."""

from __future__ import annotations

import os

import pytest

# Before anything imports TensorFlow: the stage's processes run like this (train/__init__.py),
# and in-process tests compare with them.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

from tests import factories  # noqa: E402


@pytest.fixture
def shard_set(tmp_path):
    """A small two-worker shard set of real Fashion-MNIST images: (data_dir, manifest)."""
    data_dir = str(tmp_path / "data")
    return data_dir, factories.write_shard_set(data_dir)
