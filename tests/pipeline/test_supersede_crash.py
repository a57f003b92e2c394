"""`--force-stage` killed after any of its filesystem steps never leaves the latest pointer
naming a missing model or metrics file."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import tensorflow as tf

from contract import atomic, layout, pointer, storage
from pipeline import supersede

DATE = "2026-01-31"
MODEL_BYTES = b"the blessed model"
# Every call that changes the filesystem: the process is "killed" right after each in turn.
STEPS: list[tuple[Any, str]] = [
    (os, "rename"),
    (os, "replace"),
    (os, "link"),
    (os, "makedirs"),
    (shutil, "copyfile"),
    (tf.io.gfile, "rename"),
    (tf.io.gfile, "copy"),
    (tf.io.gfile, "rmtree"),
    (tf.io.gfile, "makedirs"),
]


class Killed(BaseException):
    """Stands for SIGKILL: no `except Exception` in the code under test catches it."""


def _kill_after(monkeypatch: pytest.MonkeyPatch, step: int) -> list[str]:
    """Makes the `step`-th filesystem change (1-based) the last one; returns the steps run."""
    done: list[str] = []

    def wrap(owner: Any, name: str) -> Callable[..., Any]:
        real = getattr(owner, name)

        def changed(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            done.append(f"{name}{args[:2]}")
            if len(done) == step:
                raise Killed(done[-1])
            return result

        return changed

    for owner, name in STEPS:
        monkeypatch.setattr(owner, name, wrap(owner, name))
    return done


def _blessed_run(root: str) -> None:
    """A date whose model and metrics the latest pointer names (paths relative to root)."""
    train, evaluate = layout.train_dir(root, DATE), layout.evaluate_dir(root, DATE)
    for folder in (train, evaluate, layout.data_dir(root, DATE)):
        tf.io.gfile.makedirs(folder)
    atomic.write_bytes_atomic(layout.join(train, layout.MODEL_FILE), MODEL_BYTES)
    atomic.write_bytes_atomic(layout.join(train, layout.HISTORY_FILE), b"{}")
    atomic.write_json_atomic(layout.join(evaluate, layout.METRICS_FILE), {"accuracy": 0.9})
    atomic.write_json_atomic(layout.join(layout.data_dir(root, DATE), "manifest.json"), {})
    pointer.write(
        root,
        {
            "date": DATE,
            "model_path": layout.join(train, layout.MODEL_FILE),
            "metrics_path": layout.join(evaluate, layout.METRICS_FILE),
            "accuracy": 0.9,
            "dataset": "fashion_mnist",
        },
    )


def _check_pointer(root: str) -> None:
    current = pointer.read(root)
    assert current is not None
    with tf.io.gfile.GFile(pointer.resolve(root, current["model_path"]), "rb") as f:
        assert f.read() == MODEL_BYTES
    assert pointer.is_complete(root, current)
    assert pointer.problem(root, current) is None
    assert current["accuracy"] == 0.9


@pytest.fixture(params=["local", "remote"])
def make_root(request, tmp_path, monkeypatch) -> Iterator[Callable[[], str]]:
    """Fresh roots: local folders, or URL roots (TensorFlow's ram:// stands in for gs://)."""
    monkeypatch.setenv(storage.STATE_DIR_ENV, str(tmp_path / "state"))
    made: list[str] = []

    def make() -> str:
        name = uuid.uuid4().hex
        root = str(tmp_path / name) if request.param == "local" else f"ram://crash-{name}/runs"
        _blessed_run(root)
        made.append(root)
        return root

    yield make
    for root in made:
        if storage.is_remote(root):
            tf.io.gfile.rmtree(root)


def test_a_kill_after_any_step_leaves_the_pointer_naming_the_model(make_root, monkeypatch):
    step = 0
    while True:
        step += 1
        root = make_root()
        with monkeypatch.context() as patched:
            done = _kill_after(patched, step)
            try:
                supersede.supersede(root, DATE, "train")
            except Killed:
                pass
            else:
                break  # every step ran: the last kill point is passed
        _check_pointer(root)
        assert len(done) == step
    assert step > 3  # the move was interrupted at each of its steps
    _check_pointer(root)
    moved = pointer.read(root)
    assert moved is not None and "/superseded/" in moved["model_path"]
    assert supersede.KEEP_DIR not in moved["model_path"]
