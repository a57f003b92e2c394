"""What is served is what was blessed on gs://, and TF Serving never finds half a version.

One evaluation of a night on a gs:// output root (the local GCS emulator, tests.gcs_emulator)
is recorded step by step: after every filesystem step that bears on what is served or decided
the bucket is copied as it stands (what a process killed right there leaves behind), and after
every object written under the served model's folder that folder is listed as a TF Serving
poll lists it. A killed run stops exactly there, so each copy is the state a kill after that
step leaves, got from one run instead of one run per step.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import tensorflow as tf

from contract import pointer, storage
from evaluate import run, served, serving
from tests.evaluate.conftest import DATE, placeholder_pictures
from tests.evaluate.test_pointer_gcs import BUCKET, gcs  # noqa: F401 - the emulator
from tests.evaluate.test_served import EARLIER, KILL_POINTS, _config, lay_two_nights

MODEL_NAME = "nightly"
VERSION, EARLIER_VERSION = 2026013100, 2026013000


@pytest.fixture(scope="module")
def bucket(gcs, tmp_path_factory) -> Iterator[Any]:  # noqa: F811 - the imported fixture
    """This process on the emulator; yields a google-cloud-storage bucket to look with."""
    from google.cloud import storage as gcs_client

    with pytest.MonkeyPatch.context() as patch:
        for name, value in gcs.items():
            patch.setenv(name, value)
        patch.setenv(storage.STATE_DIR_ENV, str(tmp_path_factory.mktemp("state")))
        yield gcs_client.Client().bucket(BUCKET)


def _name(path: str) -> str:
    """The object name of a gs:// path in the bucket."""
    return path[len(f"gs://{BUCKET}/") :].rstrip("/")


def copy_root(bucket: Any, root: str, to: str) -> None:
    """Copies every object under `root` to the same place under `to`, inside the store."""
    prefix, target = _name(root) + "/", _name(to) + "/"
    for blob in bucket.client.list_blobs(bucket, prefix=prefix):
        name = target + blob.name[len(prefix) :]
        if blob.name.endswith("/"):  # a folder's marker object
            bucket.blob(name).upload_from_string(b"")
        else:
            bucket.copy_blob(blob, bucket, name)


def poll(bucket: Any, model_dir: str) -> dict[str, dict[str, int]]:
    """The model folder as a TF Serving poll finds it: each folder whose name is all digits
    (the only ones it takes for versions), with its files and their sizes."""
    prefix = _name(model_dir) + "/"
    found: dict[str, dict[str, int]] = {}
    for blob in bucket.client.list_blobs(bucket, prefix=prefix):
        folder, _, rest = blob.name[len(prefix) :].partition("/")
        if folder.isdigit():
            files = found.setdefault(folder, {})
            if rest and not rest.endswith("/"):
                files[rest] = blob.size
    return found


def half_versions(
    views: list[dict[str, dict[str, int]]], complete: dict[str, dict[str, int]]
) -> list[str]:
    """Every sighting, across the polls, of a version that TF Serving would load (its graph is
    there) without all of the model's files, or that is marked pushed without all its files.

    The push marker is not part of the model: a loadable version may lack it (a push killed
    before it, which the next evaluation quarantines, or a version on its way out)."""
    seen = []
    for step, view in enumerate(views):
        for version, files in view.items():
            wanted = complete[version]
            if serving.PUSH_MARKER in files:
                needed = wanted
            elif serving.SAVED_MODEL_PB in files:
                needed = {k: v for k, v in wanted.items() if k != serving.PUSH_MARKER}
            else:
                continue
            missing = sorted(k for k, size in needed.items() if files.get(k) != size)
            if missing:
                seen.append(f"poll {step}: version {version} lacks {missing}")
    return seen


STEPS = ("rename", "copy", "rmtree", "remove", "makedirs")


def record(monkeypatch: pytest.MonkeyPatch, after_each: Callable[[str, str], None]) -> None:
    """Calls `after_each(function name, path)` after every filesystem change this process
    makes through tf.io.gfile, and after the pointer's generation-checked upload."""

    def wrap(owner: Any, name: str) -> None:
        real = getattr(owner, name)

        def changed(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            after_each(name, str(args[0]))
            return result

        monkeypatch.setattr(owner, name, changed)

    for name in STEPS:
        wrap(tf.io.gfile, name)
    wrap(pointer, "_write_gcs")


@pytest.fixture(scope="module")
def recorded_night(bucket, trained_template, tmp_path_factory) -> dict[str, Any]:
    """EARLIER blessed and served, DATE (another model) trained, on gs://; DATE's evaluation
    recorded: the copy of the bucket after each kill point, the polls of the served folder.

    EARLIER is evaluated on a local root and uploaded (its evaluation on gs:// is the one
    recorded here, one night later)."""
    from contract import gfile

    local = tmp_path_factory.mktemp("two-nights") / "runs"
    lay_two_nights(local, trained_template)
    base = f"gs://{BUCKET}/{uuid.uuid4().hex}"
    root = f"{base}/runs"
    gfile.upload_folder(str(local), root)
    assert served.problems(root, f"{root}/serving", MODEL_NAME) == []

    model_dir = served.model_dir(f"{root}/serving", MODEL_NAME)
    kills: list[tuple[str, str]] = []  # (the step, the copy of the root it left)
    polls = [poll(bucket, model_dir)]

    def after_each(name: str, path: str) -> None:
        if path.startswith(model_dir + "/"):
            polls.append(poll(bucket, model_dir))
        if any(point in path for point in KILL_POINTS):
            killed = f"{base}/kill-{len(kills) + 1}/runs"
            copy_root(bucket, root, killed)
            kills.append((f"{name} {path[len(root) + 1 :]}", killed))

    with placeholder_pictures(), pytest.MonkeyPatch.context() as patch:
        record(patch, after_each)
        run(_config(root, DATE))
    return {"root": root, "base": base, "kills": kills, "polls": polls, "model_dir": model_dir}


def _problems(root: str) -> list[str]:
    return served.problems(root, f"{root}/serving", MODEL_NAME)


def test_a_kill_after_any_step_of_evaluate_and_push_on_gs_is_repaired(recorded_night):
    kills = recorded_night["kills"]
    assert len(kills) > 10, kills  # the copies of the export's files are steps of their own
    broken, outcomes = [], set()
    for step, (done, root) in enumerate(kills, 1):
        found = _problems(root)
        if found:
            broken.append(step)
            # Only a push whose pointer move never happened: a version newer than the pointer's.
            assert pointer.read(root)["date"] == EARLIER, (done, found)  # type: ignore[index]
            assert f"the newest served version is {VERSION}, not {EARLIER_VERSION}" in found[0]
        # What the next evaluation or rollback does first, under the pointer's lock.
        with pointer.pointer_lock(root):
            quarantined = served.reconcile(root, f"{root}/serving", MODEL_NAME)
        assert _problems(root) == [], (done, _problems(root))
        assert bool(quarantined) == bool(found), done
        outcomes.add(pointer.read(root)["date"])  # type: ignore[index]
    # Killed before the version appeared, while it was copied and before the pointer moved,
    # and after: the broken steps are one stretch, ending at the pointer's move.
    assert broken and broken == list(range(broken[0], broken[-1] + 1))
    assert "latest.json" in kills[broken[-1]][0]
    assert broken[0] > 1 and outcomes == {EARLIER, DATE}
    # The run itself went to the end: DATE is blessed and served.
    root = recorded_night["root"]
    assert _problems(root) == [] and pointer.read(root)["version"] == VERSION  # type: ignore[index]


def test_tf_serving_never_finds_a_version_on_gs_before_all_its_files(recorded_night, bucket):
    polls = recorded_night["polls"]
    complete = poll(bucket, recorded_night["model_dir"])
    assert set(complete) == {str(EARLIER_VERSION), str(VERSION)}
    assert serving.SAVED_MODEL_PB in complete[str(VERSION)]
    assert any(k.startswith("variables/") for k in complete[str(VERSION)])
    # The version folder was listed, file after file, long before it could load...
    partial = [p for p in polls if str(VERSION) in p and p[str(VERSION)] != complete[str(VERSION)]]
    assert len(partial) >= 3
    # ...and never loadable, nor marked pushed, before all of it was there.
    assert half_versions(polls, complete) == []


def test_a_rollback_on_gs_brings_a_version_back_whole(recorded_night, bucket):
    root = f"{recorded_night['base']}/rollback/runs"
    copy_root(bucket, recorded_night["root"], root)
    export_base = f"{root}/serving"
    model_dir = served.model_dir(export_base, MODEL_NAME)
    complete = poll(bucket, model_dir)
    polls = [complete]

    def after_each(name: str, path: str) -> None:
        polls.append(poll(bucket, model_dir))

    with pytest.MonkeyPatch.context() as patch:
        record(patch, after_each)
        served.quarantine(export_base, MODEL_NAME, VERSION, "rolled back")
        assert str(VERSION) not in poll(bucket, model_dir)
        sha = pointer.read(root)["model_sha256"]  # type: ignore[index]
        assert served.restore(export_base, MODEL_NAME, VERSION, sha)
    assert poll(bucket, model_dir) == complete
    assert len(polls) > 10
    assert half_versions(polls, complete) == []
