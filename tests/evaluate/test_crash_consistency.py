"""A crash between moving the latest pointer and writing metrics.json stays consistent."""

from __future__ import annotations

import os

import pytest

from contract import atomic, layout, pointer
from evaluate import run
from tests.evaluate.conftest import DATE


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
