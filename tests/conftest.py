"""Shared pytest fixtures."""

from __future__ import annotations

import os

import pytest

from tests import factories

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture
def shard_set(tmp_path):
    """A small two-worker shard set of real Fashion-MNIST images: (data_dir, manifest)."""
    data_dir = str(tmp_path / "data")
    return data_dir, factories.write_shard_set(data_dir)
