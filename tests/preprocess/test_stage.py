"""The whole stage on the tiny TFDS build: counts, manifest, determinism, atomic output."""

from __future__ import annotations

import collections
import os
import shutil
import signal

import pytest

from contract import layout, manifest, records
from preprocess import run_preprocess
from preprocess.errors import PreprocessError
from tests import factories, forked
from tests.preprocess.conftest import tiny_config


def data_dir_of(cfg) -> str:
    return layout.data_dir(cfg.output_root, cfg.date)


def file_bytes(data_dir: str) -> dict[str, bytes]:
    out = {}
    for root, _, names in os.walk(data_dir):
        for name in names:
            if name.endswith(".tfrecord"):
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    out[os.path.relpath(path, data_dir)] = f.read()
    return out


@pytest.fixture(scope="module")
def default_run(tiny_tfds, tiny_sources, tmp_path_factory):
    """The stage run once on tiny_config's defaults (four workers), for the tests that only
    read its output or compare with it: (config, manifest)."""
    output_root = str(tmp_path_factory.mktemp("default") / "runs")
    cfg = tiny_config(tiny_tfds, tiny_sources, output_root=output_root)
    return cfg, run_preprocess(cfg)


def test_counts_balance_and_manifest(default_run):
    cfg, doc = default_run
    data_dir = data_dir_of(cfg)
    assert manifest.verify(data_dir) == doc
    # 300 train: 30 validation, 270 / 4 workers = 67 each, 2 leftover into validation.
    assert doc["splits"] == {
        "train": {"num_examples": 268, "examples_per_worker": 67, "leftover_examples": 2},
        "validation": {
            "num_examples": 32,
            "held_out_examples": 30,
            "leftover_train_examples": 2,
        },
        "eval": {"num_examples": 100, "duplicates_in_training": 0},
    }
    per_worker = collections.Counter()
    for worker in range(4):
        for path in manifest.shard_paths_for_worker(data_dir, doc, worker):
            per_worker[worker] += sum(1 for _ in _records(path))
    assert per_worker == {0: 67, 1: 67, 2: 67, 3: 67}
    assert doc["image_shape"] == [28, 28, 1] and doc["class_names"] == factories.CLASS_NAMES
    assert doc["dataset"] == {
        "name": "fashion_mnist",
        "version": "3.0.1",
        "adapter": "tfds",
        "train_split": "train",
        "eval_split": "test",
    }
    assert doc["parameters"]["validation_fraction"] == 0.1 and doc["num_workers"] == 4
    assert sorted(os.listdir(os.path.dirname(data_dir))) == ["data"]


def _records(path: str):
    import tensorflow as tf

    return tf.data.TFRecordDataset(path).as_numpy_iterator()


def test_records_decode_to_the_source_images(default_run):
    import tensorflow as tf

    cfg, doc = default_run
    paths = manifest.split_paths(data_dir_of(cfg), doc, layout.EVAL_SPLIT)
    images, labels = records.parse_batch(
        next(iter(tf.data.TFRecordDataset(paths).batch(100))), doc["image_shape"]
    )
    expected_images, expected_labels = factories.fashion_mnist_arrays("test", 100)
    got = sorted(zip((i.tobytes() for i in images.numpy()), labels.numpy(), strict=True))
    want = sorted(zip((i.tobytes() for i in expected_images), expected_labels, strict=True))
    assert got == want


@pytest.mark.slow
def test_same_input_same_bytes_across_runner_modes(make_config, default_run):
    # Another date, other chunk and batch sizes, several processes: the same shard files.
    first, _ = default_run
    second = make_config(date="2026-01-02", read_chunk_size=64, batch_size=13)
    run_preprocess(second, ["--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    a, b = file_bytes(data_dir_of(first)), file_bytes(data_dir_of(second))
    assert len(a) == 6 and a == b


def test_max_records_per_file_splits_worker_parts(make_config):
    cfg = make_config(num_workers=2, max_records_per_file=50)
    doc = run_preprocess(cfg)
    names = [os.path.basename(p) for p in manifest.shard_paths_for_worker(data_dir_of(cfg), doc, 1)]
    assert names == [f"worker-00001-of-00002-file-{i:05d}-of-00003.tfrecord" for i in range(3)]
    assert [f["num_examples"] for f in manifest.file_entries(doc, "train", 1)] == [50, 50, 35]
    assert len(manifest.file_entries(doc, "eval")) == 2


def test_complete_output_is_refused_then_replaced_with_overwrite(make_config, default_run):
    cfg = make_config()
    # A complete shard set of this config: the default run's output, copied under this root.
    shutil.copytree(os.path.dirname(data_dir_of(default_run[0])), os.path.dirname(data_dir_of(cfg)))
    with pytest.raises(PreprocessError, match="already complete: .*manifest.json .*--overwrite"):
        run_preprocess(cfg)
    doc = run_preprocess(make_config(num_workers=3, overwrite=True))
    assert manifest.verify(data_dir_of(cfg))["num_workers"] == doc["num_workers"] == 3
    assert sorted(os.listdir(os.path.dirname(data_dir_of(cfg)))) == ["data"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_workers": 0}, "num_workers must be at least 1, got 0"),
        (
            {"num_workers": 271},
            "num_workers 271 is larger than the 270 training examples of 'fashion_mnist'",
        ),
        ({"validation_fraction": 1.0}, r"validation_fraction must be in \[0, 1\), got 1.0"),
        ({"validation_fraction": -0.1}, r"validation_fraction must be in \[0, 1\), got -0.1"),
        ({"dataset": "no_such_dataset"}, "unknown TFDS dataset 'no_such_dataset'"),
        ({"eval_split": "validation"}, "has no split 'validation'; it has"),
        ({"date": "31.01.2026"}, "date must be a calendar date YYYY-MM-DD"),
    ],
)
def test_bad_input_leaves_nothing(make_config, overrides, message):
    cfg = make_config(**overrides)
    with pytest.raises(PreprocessError, match=message):
        run_preprocess(cfg)
    run_dir = os.path.join(cfg.output_root, cfg.date)  # not layout's: it refuses a bad date
    assert not os.path.exists(run_dir) or os.listdir(run_dir) == []


def test_unwritable_output_folder(make_config, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cfg = make_config(output_root=str(blocker / "runs"))
    with pytest.raises(PreprocessError, match=r"cannot write to output folder .*a-file/runs/"):
        run_preprocess(cfg)


def test_multi_threading_mode_is_refused(make_config):
    cfg = make_config()
    with pytest.raises(PreprocessError, match="multi_threading loses elements"):
        run_preprocess(cfg, ["--direct_num_workers=2", "--direct_running_mode=multi_threading"])
    run_dir = os.path.dirname(data_dir_of(cfg))
    assert not os.path.exists(run_dir) or os.listdir(run_dir) == []


def test_missing_sources_for_a_fresh_build_leave_nothing(make_config, tmp_path):
    cfg = make_config(data_dir=str(tmp_path / "fresh-tfds"), manual_dir=str(tmp_path / "empty"))
    with pytest.raises(PreprocessError, match=r"source file missing: .*empty/t10k-images"):
        run_preprocess(cfg)
    assert os.listdir(os.path.dirname(data_dir_of(cfg))) == []


def test_a_runner_that_loses_a_record_is_refused_and_nothing_is_published(make_config, monkeypatch):
    from preprocess import transforms

    keyed = transforms.SpillFragments.key

    def lose_one(self, batch):
        if self._role == "train" and not hasattr(lose_one, "done"):
            lose_one.done = True  # the first train batch loses its first record
            batch = batch[1:]
        return keyed(self, batch)

    monkeypatch.setattr(transforms.SpillFragments, "key", lose_one)
    cfg = make_config()
    with pytest.raises(PreprocessError) as refused:
        run_preprocess(cfg)
    message = str(refused.value)
    assert "split 'train' has 300 examples but the runner wrote 299" in message
    assert "nothing published" in message and "\n" not in message
    assert os.listdir(os.path.dirname(data_dir_of(cfg))) == []


def test_a_file_missing_from_the_plan_is_refused(make_config, monkeypatch):
    from preprocess import pipeline

    planned = pipeline.check_written

    def rename_one(cfg, spec, sizes, files, staging):
        # Same counts, one file under a name the plan does not have (a stray retry's output).
        stray = {**files[-1], "path": "eval/stray.tfrecord"}
        planned(cfg, spec, sizes, [*files[:-1], stray], staging)

    monkeypatch.setattr(pipeline, "check_written", rename_one)
    cfg = make_config(max_records_per_file=40)
    with pytest.raises(PreprocessError, match=r"wrote \d+ files, the plan has \d+ \(missing"):
        run_preprocess(cfg)
    assert os.listdir(os.path.dirname(data_dir_of(cfg))) == []


@pytest.mark.slow
def test_staging_left_by_a_killed_run_is_removed_by_the_next_run(make_config):
    import sys

    cfg = make_config()
    data_dir = data_dir_of(cfg)
    # A writer that makes its staging folder, then is killed: its lock dies with it.
    killed = forked.run(
        [sys.executable, "-m", "tests.preprocess.killed_writer", data_dir],
        env=os.environ,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    from preprocess import shard_set

    dead = [p for p in os.listdir(os.path.dirname(data_dir)) if ".tmp-" in p]
    assert len(dead) == 1
    live = shard_set.make_staging(data_dir)  # a writer that still runs (this process)
    try:
        run_preprocess(cfg)
        left = sorted(p for p in os.listdir(os.path.dirname(data_dir)) if ".tmp-" in p)
        assert left == [os.path.basename(live)]  # the dead one is gone, the live one stays
    finally:
        shard_set.remove(live)
    assert sorted(os.listdir(os.path.dirname(data_dir))) == ["data"]


def test_a_retried_write_leaves_no_partial_or_duplicate_file(make_config, monkeypatch):
    from preprocess import transforms

    atomic_write = transforms.write_file_atomic
    attempts = collections.Counter()

    def killed_once(path, write):
        # The first attempt at each shard file dies after writing half of it under its
        # temporary name, as a task on a worker that is killed does; the runner retries.
        attempts[path] += 1
        if attempts[path] == 1 and "_buckets" not in path:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write(f"{path}.tmp-killed")
            with open(f"{path}.tmp-killed", "r+b") as f:
                f.truncate(os.path.getsize(f"{path}.tmp-killed") // 2)
        atomic_write(path, write)

    monkeypatch.setattr(transforms, "write_file_atomic", killed_once)
    cfg = make_config()
    doc = run_preprocess(cfg)
    data_dir = data_dir_of(cfg)
    on_disk = sorted(
        os.path.relpath(os.path.join(root, name), data_dir)
        for root, _, names in os.walk(data_dir)
        for name in names
    )
    assert on_disk == sorted(
        [f["path"] for f in doc["files"]] + [layout.MANIFEST_FILE, manifest.STATISTICS_FILE]
    )
    assert manifest.verify(data_dir) == doc
