"""Fixtures of the evaluate tests: one trained run per session, copied into each test's folder."""

from __future__ import annotations

import base64
import contextlib
import shutil
from collections.abc import Iterator

import pytest

from contract import atomic
from evaluate import EvaluateConfig, plots
from tests.evaluate import trained_run

DATE = "2026-01-31"

# A valid 1x1 PNG: what the stage's pictures are replaced with where they are not under test.
PLACEHOLDER_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJ"
    "RU5ErkJggg=="
)
# The pictures an evaluation draws for its report (the trend page's plot is drawn apart).
REPORT_PICTURES = ("write_confusion_matrix", "write_training_curves", "write_reliability_diagram")


@contextlib.contextmanager
def placeholder_pictures() -> Iterator[None]:
    """Within it, an evaluation writes `PLACEHOLDER_PNG` for each report picture, through the
    same atomic write, instead of drawing it with matplotlib.

    Drawing is half of an in-process evaluation's time; tests about verdicts, pushes and
    pointers do not look at the pictures. The real ones are checked by test_stage.py,
    test_report_page.py and test_trend_browser.py.
    """

    def placeholder(*args: object) -> bytes:
        atomic.write_bytes_atomic(str(args[-1]), PLACEHOLDER_PNG)  # the path is the last
        return PLACEHOLDER_PNG

    with pytest.MonkeyPatch.context() as patch:
        for name in REPORT_PICTURES:
            patch.setattr(plots, name, placeholder)
        yield


@pytest.fixture
def quick_pictures() -> Iterator[None]:
    """`placeholder_pictures` for one test."""
    with placeholder_pictures():
        yield


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
