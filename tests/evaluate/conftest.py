"""Fixtures of the evaluate tests: one trained run per session, copied into each test's folder."""

from __future__ import annotations

import shutil

import pytest

from evaluate import EvaluateConfig
from tests.evaluate import trained_run

DATE = "2026-01-31"


@pytest.fixture(scope="session")
def trained_template(tmp_path_factory):
    """A run folder with a shard set (300 eval examples) and a tiny trained model."""
    root = tmp_path_factory.mktemp("trained")
    info = trained_run.write_trained_run(str(root), DATE)
    return root, info


@pytest.fixture
def run_root(trained_template, tmp_path):
    """A private copy of the trained run: `<tmp>/runs/<DATE>/{data,train}`."""
    template, _ = trained_template
    root = tmp_path / "runs"
    shutil.copytree(template, root)
    return root


@pytest.fixture
def make_config(run_root):
    """Builds an EvaluateConfig for the copied run; keyword arguments override fields.

    Without a threshold among them the config asks explicitly to bless without thresholds:
    these tests are about scoring, files and pointers, not about the rules.
    """

    def make(**overrides) -> EvaluateConfig:
        fields = {
            "output_root": str(run_root),
            "date": DATE,
            "batch_size": 128,
            "bless_without_thresholds": True,
        } | overrides
        return EvaluateConfig(**fields)

    return make
