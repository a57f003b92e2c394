"""What is served is what was blessed: after a crash at any step, a reversed verdict, a repair."""

from __future__ import annotations

import os
import pathlib
import shutil
from collections.abc import Callable
from typing import Any

import pytest
import tensorflow as tf
import tf_keras

from contract import atomic, layout, pointer
from evaluate import EvaluateConfig, run, served, serving, versions
from pipeline import supersede
from tests.evaluate import trained_run
from tests.evaluate.conftest import DATE, placeholder_pictures

EARLIER = "2026-01-30"

# The pictures are checked in test_stage.py and test_report_page.py.
pytestmark = pytest.mark.usefixtures("quick_pictures")


class Killed(BaseException):
    """Stands for SIGKILL: no `except Exception` in the code under test catches it."""


# Every call of the stage that changes the filesystem; the process "dies" right after one of
# those that touch what is served or decided (the pictures and predictions before them, and
# the trend page after them, bear on neither).
KILL_POINTS = ("serving", "latest.json", "blessing.json", "push.json", "metrics.json")
STEPS: list[tuple[Any, str]] = [
    (os, "rename"),
    (os, "replace"),
    (os, "makedirs"),
    (os, "remove"),
    (tf.io.gfile, "rename"),
    (tf.io.gfile, "copy"),
    (tf.io.gfile, "rmtree"),
    (tf.io.gfile, "remove"),
    (tf.io.gfile, "makedirs"),
]


def _copy_after_each_kill_point(
    monkeypatch: pytest.MonkeyPatch, root: pathlib.Path, copies: pathlib.Path
) -> list[tuple[str, pathlib.Path]]:
    """After every step that touches a kill point, copies `root` as it stands: what a process
    killed right after that step leaves behind. Returns the (step, copy) list, filled in as
    the steps happen.

    One run recorded this way gives the state a kill after each step leaves, without one run
    per step: a killed process writes nothing after its kill, and the copy is taken before the
    run goes on.
    """
    kills: list[tuple[str, pathlib.Path]] = []
    copying = False

    def wrap(owner: Any, name: str) -> Callable[..., Any]:
        real = getattr(owner, name)

        def changed(*args: Any, **kwargs: Any) -> Any:
            nonlocal copying
            result = real(*args, **kwargs)
            if copying or not any(point in str(args[:1]) for point in KILL_POINTS):
                return result
            copy = copies / f"kill-{len(kills) + 1}"
            copying = True  # the copy's own makedirs are no steps of the run
            try:
                shutil.copytree(root, copy)
            finally:
                copying = False
            kills.append((f"{name}{args[:1]}", copy))
            return result

        return changed

    for owner, name in STEPS:
        monkeypatch.setattr(owner, name, wrap(owner, name))
    return kills


def _config(root, date=DATE, **thresholds) -> EvaluateConfig:
    thresholds = thresholds or {"min_accuracy": 0.0, "max_regression": 0.5}
    return EvaluateConfig(output_root=str(root), date=date, batch_size=128, **thresholds)


def _problems(root) -> list[str]:
    return served.problems(str(root), layout.join(str(root), "serving"), "nightly")


def _reconcile(root) -> list[str]:
    with pointer.pointer_lock(str(root)):
        return served.reconcile(str(root), layout.join(str(root), "serving"), "nightly")


def _quarantined(root) -> list[str]:
    folder = served.quarantine_dir(os.path.join(str(root), "serving"), "nightly")
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def lay_two_nights(root: pathlib.Path, trained_template) -> None:
    """Makes `root` (a local output root): EARLIER evaluated, blessed and served; DATE
    trained, another model."""
    template, info = trained_template
    shutil.copytree(template / DATE, root / EARLIER)
    with placeholder_pictures():
        run(_config(root, EARLIER))
    shutil.copytree(template / DATE, root / DATE)
    doc = info["manifest"]
    images, labels = trained_run.read_split(str(root / DATE / "data"), doc, layout.TRAIN_SPLIT)
    other = trained_run.tiny_model(doc["image_shape"], doc["num_classes"], seed=3)
    other.fit(images, labels, batch_size=64, epochs=1, verbose=0)
    other.save(str(root / DATE / "train" / layout.MODEL_FILE))


@pytest.fixture(scope="module")
def two_nights_template(trained_template, tmp_path_factory) -> pathlib.Path:
    """The two nights of `lay_two_nights`, laid once for the module (copied by each test:
    the paths they record are relative to the output root)."""
    root = tmp_path_factory.mktemp("two-nights") / "runs"
    lay_two_nights(root, trained_template)
    assert _problems(root) == []
    return root


@pytest.fixture
def two_nights(two_nights_template, tmp_path) -> pathlib.Path:
    """`<tmp>/runs`: EARLIER evaluated, blessed and served; DATE trained (another model)."""
    root = tmp_path / "runs"
    shutil.copytree(two_nights_template, root)
    return root


@pytest.fixture(scope="module")
def date_blessed_template(two_nights_template, tmp_path_factory) -> pathlib.Path:
    """The two nights, then DATE evaluated, blessed and served after EARLIER."""
    root = tmp_path_factory.mktemp("date-blessed") / "runs"
    shutil.copytree(two_nights_template, root)
    with placeholder_pictures():
        metrics = run(_config(root))
    assert metrics["blessed"] and metrics["push"]["version"] == 2026013100
    return root


@pytest.fixture
def date_blessed(date_blessed_template, tmp_path) -> pathlib.Path:
    """A private copy of `date_blessed_template`."""
    root = tmp_path / "blessed" / "runs"
    shutil.copytree(date_blessed_template, root)
    return root


def test_a_kill_after_any_step_of_evaluate_and_push_is_repaired_by_the_next_command(
    two_nights, tmp_path, monkeypatch
):
    root = two_nights
    with monkeypatch.context() as patched:
        kills = _copy_after_each_kill_point(patched, root, tmp_path / "kills")
        run(_config(root))
    assert len(kills) > 6, kills
    outcomes = set()
    for done, killed in kills:
        # What the next command (an evaluation, a rollback) does first, then the invariant.
        _reconcile(killed)
        assert _problems(killed) == [], done
        outcomes.add(pointer.read(str(killed))["date"])
    assert outcomes == {EARLIER, DATE}  # killed both before and after the pointer moved
    # The run itself went to the end: DATE is blessed and served, and the pointer records the
    # served version, a complete local export with its signature.
    assert _problems(root) == [] and pointer.read(str(root))["date"] == DATE
    current = pointer.read(str(root))
    assert current["version"] == versions.version_for_date(DATE)
    loaded = tf.saved_model.load(str(root / "serving" / "nightly" / str(current["version"])))
    assert serving.SERVING_SIGNATURE in loaded.signatures
    assert not isinstance(loaded, tf_keras.Model)


def test_a_push_whose_pointer_never_moved_is_quarantined_by_the_next_evaluation(
    two_nights, monkeypatch
):
    root = two_nights
    real_write = pointer.write

    def killed(*args, **kwargs):
        raise Killed("before the pointer moved")

    monkeypatch.setattr(pointer, "write", killed)
    with pytest.raises(Killed):
        run(_config(root))
    monkeypatch.setattr(pointer, "write", real_write)
    version = versions.version_for_date(DATE)
    assert served.served_versions(str(root / "serving"), "nightly")[-1] == version
    assert "the newest served version is 2026013100, not 2026013000" in " ".join(_problems(root))

    # The next evaluation (a rerun of the night, stricter) repairs first, then decides.
    run(_config(root, min_accuracy=0.999))
    assert _problems(root) == []
    assert pointer.read(str(root))["date"] == EARLIER
    (moved,) = _quarantined(root)
    assert moved.startswith(f"{version}-")
    folder = root / "serving" / "nightly.quarantine" / moved
    note = atomic.read_json(str(folder / served.QUARANTINE_NOTE))
    assert "no blessed night is behind it" in note["reason"]
    assert versions.read_marker(str(folder)) is not None


@pytest.mark.parametrize("earlier_night", [True, False])
def test_a_reversed_verdict_takes_pointer_and_served_version_back(
    two_nights_template, tmp_path, request, earlier_night
):
    if earlier_night:
        root = request.getfixturevalue("date_blessed")
    else:
        root = tmp_path / "alone"
        shutil.copytree(two_nights_template / DATE, root / DATE)
        run(_config(root))
    assert pointer.read(str(root))["date"] == DATE and _problems(root) == []

    supersede.supersede(str(root), DATE, "evaluate")  # --force-stage evaluate
    metrics = run(_config(root, min_accuracy=0.999))
    assert not metrics["blessed"]
    verdict = atomic.read_json(str(root / DATE / "evaluate" / layout.BLESSING_FILE))
    versions = served.served_versions(str(root / "serving"), "nightly")
    assert _quarantined(root)[0].startswith("2026013100-")
    if earlier_night:
        assert pointer.read(str(root))["date"] == EARLIER
        assert versions == [2026013000]
        assert any(f"taken back to {EARLIER}" in r for r in verdict["reasons"])
        assert _problems(root) == []
    else:
        assert pointer.read(str(root)) is None and versions == []
        assert any("no earlier blessed night is left" in r for r in verdict["reasons"])
        assert _problems(root) == []


def test_a_retrained_date_blessed_again_gets_a_new_version_and_the_old_one_leaves(date_blessed):
    root = date_blessed
    first = pointer.read(str(root))
    assert first["version"] == 2026013100
    supersede.supersede(str(root), DATE, "train")  # --force-stage train: a new model
    doc = atomic.read_json(str(root / DATE / "data" / layout.MANIFEST_FILE))
    retrained = trained_run.tiny_model(doc["image_shape"], doc["num_classes"], seed=4)
    (root / DATE / "train").mkdir()
    retrained.save(str(root / DATE / "train" / layout.MODEL_FILE))
    shutil.copy(
        root / EARLIER / "train" / layout.HISTORY_FILE, root / DATE / "train" / layout.HISTORY_FILE
    )
    metrics = run(_config(root, min_accuracy=0.0, max_regression=1.0))
    assert metrics["blessed"] and metrics["push"]["version"] == 2026013101
    current = pointer.read(str(root))
    assert current["version"] == 2026013101 and current["model_sha256"] != first["model_sha256"]
    assert served.served_versions(str(root / "serving"), "nightly") == [2026013000, 2026013101]
    assert [name.split("-")[0] for name in _quarantined(root)] == ["2026013100"]
    assert _problems(root) == []


def test_a_rejected_backfill_with_the_same_bytes_leaves_the_pointer_on_the_newer_night(
    trained_template, tmp_path
):
    # Two nights whose model files are byte for byte the same: rejecting the older night's
    # is no reason to take the pointer off the newer one.
    template, _ = trained_template
    root = tmp_path / "runs"
    for date in (EARLIER, DATE):
        shutil.copytree(template / DATE, root / date)
    run(_config(root, DATE))
    run(_config(root, EARLIER, min_accuracy=0.999))
    assert pointer.read(str(root))["date"] == DATE
    assert _problems(root) == []
