"""A crash between moving the latest pointer and writing metrics.json stays consistent."""

from __future__ import annotations

import os

import pytest

from contract import atomic, layout, pointer
from evaluate import run
from tests.evaluate.conftest import DATE

# The pictures are checked in test_stage.py and test_report_page.py.
pytestmark = pytest.mark.usefixtures("quick_pictures")


def test_crash_after_the_pointer_moved_is_completed_by_the_rerun(
    make_config, run_root, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics_path = os.path.join(layout.evaluate_dir(str(run_root), DATE), layout.METRICS_FILE)
    write = atomic.write_json_atomic

    def crash_on_metrics(path: str, obj: object) -> None:
        if path.endswith(layout.METRICS_FILE):
            raise OSError("simulated crash before metrics.json")
        write(path, obj)

    monkeypatch.setattr(atomic, "write_json_atomic", crash_on_metrics)
    config = make_config(min_accuracy=0.0, max_regression=0.0)
    with pytest.raises(OSError, match="simulated crash"):
        run(config)
    moved = pointer.read(str(run_root))
    assert moved is not None and moved["date"] == DATE
    assert not os.path.exists(metrics_path)
    assert not pointer.is_complete(str(run_root), moved)

    monkeypatch.setattr(atomic, "write_json_atomic", write)
    metrics = run(config)
    # The unfinished evaluation of this same date was not used as its own baseline.
    verdict = atomic.read_json(os.path.join(os.path.dirname(metrics_path), layout.BLESSING_FILE))
    assert verdict["baseline"] is None
    assert metrics["blessed"]
    assert os.path.exists(metrics_path)
    final = pointer.read(str(run_root))
    assert final is not None and pointer.is_complete(str(run_root), final)


@pytest.mark.parametrize("metrics_kept", [True, False])
def test_a_pointer_whose_model_is_gone_is_named_not_taken_for_a_first_blessing(
    make_config, run_root, metrics_kept: bool
) -> None:
    """As an older --force-stage killed half way left it: the pointer names another date's
    model (and metrics) that are gone. The verdict names the missing file."""
    root = str(run_root)
    earlier = "2026-01-30"
    metrics_path = os.path.join(layout.evaluate_dir(root, earlier), layout.METRICS_FILE)
    if metrics_kept:
        os.makedirs(os.path.dirname(metrics_path))
        atomic.write_json_atomic(metrics_path, {"accuracy": 0.999})
    missing = os.path.join(layout.train_dir(root, earlier), layout.MODEL_FILE)
    pointer.write(
        root,
        {"date": earlier, "model_path": missing, "metrics_path": metrics_path,
         "accuracy": 0.999, "loss": 0.01, "dataset": "fashion_mnist"},
    )  # fmt: skip
    run(make_config(min_accuracy=0.0, max_regression=0.01))
    verdict = atomic.read_json(os.path.join(layout.evaluate_dir(root, DATE), layout.BLESSING_FILE))
    said = " ".join(verdict["reasons"])
    assert "first blessing" not in said
    assert "missing" in said and f"{earlier}/train/model.keras" in said
    if not metrics_kept:
        assert f"names {earlier}'s model {earlier}/train/model.keras, which is missing" in said
