"""The scale dataset `fashion_mnist_scaled/x<N>`: offline, deterministic, N labelled copies."""

from __future__ import annotations

import fcntl
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from contract import layout, spawn
from preprocess import pipeline, scaled_dataset, sources
from preprocess.config import parse_command_line
from preprocess.errors import PreprocessError
from tests import factories
from tests.preprocess import conftest
from tests.waiting import wait_until

FACTOR = 3


def build(tiny_sources, data_dir: pathlib.Path, factor: int = FACTOR):
    manual_dir, sums = tiny_sources
    return sources.prepare_dataset(
        f"fashion_mnist_scaled/x{factor}", str(data_dir), manual_dir, sums
    )


def examples(builder, split: str) -> list[tuple[bytes, int]]:
    """(image bytes, label) of every example, sorted (TFDS shuffles at build time)."""
    batch = next(iter(builder.as_dataset(split=split).batch(1_000_000)))
    images, labels = batch["image"].numpy(), batch["label"].numpy()
    return sorted((i.tobytes(), int(lbl)) for i, lbl in zip(images, labels, strict=True))


def source_arrays(tiny_sources, split: str) -> tuple[np.ndarray, np.ndarray]:
    images_file, labels_file = scaled_dataset.SOURCE_FILES[split]
    folder = tiny_sources[0]
    images = scaled_dataset.read_idx(f"{folder}/{images_file}")[..., np.newaxis]
    return images, scaled_dataset.read_idx(f"{folder}/{labels_file}")


@pytest.fixture(scope="module")
def scaled(tiny_sources, tmp_path_factory):
    """fashion_mnist_scaled/x3 built from the tiny IDX files (300 train, 100 test)."""
    return build(tiny_sources, tmp_path_factory.mktemp("tfds-scaled"))


def test_split_sizes_and_spec(scaled):
    spec = sources.describe(scaled)
    assert spec.name == "fashion_mnist_scaled/x3"
    assert spec.split_sizes == {"train": FACTOR * conftest.TINY_TRAIN, "test": conftest.TINY_TEST}
    assert spec.image_shape == [28, 28, 1] and spec.class_names == scaled_dataset.CLASS_NAMES
    assert spec.dataset_dir.endswith("fashion_mnist_scaled/x3/1.0.0")


def test_train_is_the_source_then_perturbed_copies_with_their_labels(scaled, tiny_sources):
    images, labels = source_arrays(tiny_sources, "train")
    indices = np.arange(len(images))
    expected = []
    for copy in range(FACTOR):
        copies = scaled_dataset.perturb(images, copy, indices)
        if copy == 0:
            np.testing.assert_array_equal(copies, images)
        else:
            changed = (copies != images).reshape(len(images), -1).any(axis=1)
            assert changed.all(), f"copy {copy} left images {np.flatnonzero(~changed)} unchanged"
        expected += [(c.tobytes(), int(lbl)) for c, lbl in zip(copies, labels, strict=True)]
    assert examples(scaled, "train") == sorted(expected)
    # Copies differ from each other too (no duplicate examples within the split).
    assert len({image for image, _ in expected}) == len(expected)


def test_a_build_larger_than_the_writers_memory_spills_to_disk_intact(
    tiny_sources, tmp_path, monkeypatch
):
    # TFDS's writer keeps up to shuffle.MAX_MEM_BUFFER_SIZE (1 GB) of examples in memory and
    # then moves them to bucket files on disk: x100 takes that path. A 64 kB buffer makes the
    # tiny build take it too.
    from tensorflow_datasets.core import shuffle

    monkeypatch.setattr(shuffle, "MAX_MEM_BUFFER_SIZE", 64 << 10)
    to_disk = []
    add_to_bucket = shuffle.Shuffler._add_to_bucket

    def counting_add_to_bucket(self, hkey, data):
        to_disk.append(len(data))
        return add_to_bucket(self, hkey, data)

    monkeypatch.setattr(shuffle.Shuffler, "_add_to_bucket", counting_add_to_bucket)
    spilled = build(tiny_sources, tmp_path / "tfds", factor=2)
    assert len(to_disk) >= conftest.TINY_TRAIN  # most of the train split went through disk
    images, labels = source_arrays(tiny_sources, "train")
    indices = np.arange(len(images))
    expected = [
        (image.tobytes(), int(label))
        for copy in range(2)
        for image, label in zip(scaled_dataset.perturb(images, copy, indices), labels, strict=True)
    ]
    assert examples(spilled, "train") == sorted(expected)


def test_test_split_is_the_real_test_images(scaled, tiny_sources):
    images, labels = source_arrays(tiny_sources, "test")
    expected = sorted((i.tobytes(), int(lbl)) for i, lbl in zip(images, labels, strict=True))
    assert examples(scaled, "test") == expected


def test_perturbation_depends_only_on_copy_and_index(tiny_sources):
    images, _ = source_arrays(tiny_sources, "train")
    indices = np.arange(len(images))
    whole = scaled_dataset.perturb(images, 7, indices)
    part = scaled_dataset.perturb(images[50:90], 7, indices[50:90])
    np.testing.assert_array_equal(part, whole[50:90])
    assert not np.array_equal(whole, scaled_dataset.perturb(images, 8, indices))
    moved = np.abs(whole.astype(int) - images.astype(int))
    assert moved.max() > scaled_dataset.NOISE  # shifted or mirrored, not only noisy


@pytest.mark.slow
def test_two_builds_write_the_same_examples_in_the_same_order(tiny_sources, taking_turns, tmp_path):
    # Examples, not file bytes: TFDS serialises the feature map in an order that can differ
    # between processes (the stage decodes and re-encodes every record anyway).
    # The second build is the one another process made while taking turns: nothing may hang
    # on per-process state (Python's string hashing, TFDS's map order).
    assert taking_turns["returncodes"] == [0, 0], taking_turns["outputs"]
    first = build(tiny_sources, tmp_path / "a", factor=2)
    second = sources.prepare_dataset("fashion_mnist_scaled/x2", str(taking_turns["data_dir"]))

    def in_file_order(builder) -> list[tuple[bytes, int]]:
        dataset = builder.as_dataset(split="train", shuffle_files=False)
        return [(e["image"].tobytes(), int(e["label"])) for e in dataset.as_numpy_iterator()]

    assert in_file_order(first) == in_file_order(second)
    assert len(in_file_order(first)) == 2 * conftest.TINY_TRAIN


def test_named_configs_and_any_factor():
    cls = sources.builder_class("fashion_mnist_scaled/x10")
    assert cls is scaled_dataset.FashionMnistScaled
    assert sorted(cls.builder_configs) == ["x1", "x10", "x100"]
    assert cls.get_builder_config("x10").factor == 10
    assert cls.get_builder_config("x7").factor == 7
    assert cls.get_builder_config("x0") is None and cls.get_builder_config("7") is None
    assert sources.recorded_checksums_path("fashion_mnist_scaled/x3").endswith(
        "sources/fashion_mnist.sha256"
    )


@pytest.mark.parametrize(
    ("dataset", "manual", "message"),
    [
        ("fashion_mnist_scaled", True, r"'fashion_mnist_scaled' needs a scale: .*/x<N>"),
        ("fashion_mnist_scaled/y2", True, r"has no config 'y2' \(its configs: x1, x10, x100\)"),
        ("fashion_mnist_scaled/x2", False, r"built from files placed by hand: pass --manual_dir"),
    ],
)
def test_bad_requests_are_named(tiny_sources, tmp_path, dataset, manual, message):
    manual_dir, sums = tiny_sources if manual else (None, None)
    with pytest.raises(PreprocessError, match=message):
        sources.prepare_dataset(dataset, str(tmp_path / "tfds"), manual_dir, sums)
    assert not (tmp_path / "tfds" / "fashion_mnist_scaled").exists()


def test_mismatching_source_file_is_refused(tiny_sources, tmp_path):
    bad_sums = tmp_path / "bad.sha256"
    lines = pathlib.Path(tiny_sources[1]).read_text().splitlines()
    bad_sums.write_text("\n".join(["0" * 64 + lines[0][64:], *lines[1:]]) + "\n")
    with pytest.raises(PreprocessError, match="source file checksum mismatch"):
        sources.prepare_dataset(
            "fashion_mnist_scaled/x2", str(tmp_path / "tfds"), tiny_sources[0], str(bad_sums)
        )


def test_stage_takes_it_through_the_dataset_flag(tiny_sources, tmp_path):
    doc = pipeline.run_preprocess(
        *parse_command_line(
            [
                f"--output_root={tmp_path / 'runs'}",
                "--date=2026-01-31",
                "--dataset=fashion_mnist_scaled/x2",
                f"--data_dir={tmp_path / 'tfds'}",
                f"--manual_dir={tiny_sources[0]}",
                f"--manual_checksums={tiny_sources[1]}",
                "--num_workers=2",
                "--read_chunk_size=200",
                "--batch_size=64",
            ]
        )
    )
    assert doc["dataset"]["name"] == "fashion_mnist_scaled/x2"
    splits = doc["splits"]
    train_total = (
        splits[layout.TRAIN_SPLIT]["num_examples"] + splits[layout.VALIDATION_SPLIT]["num_examples"]
    )
    assert train_total == 2 * conftest.TINY_TRAIN
    assert splits[layout.EVAL_SPLIT]["num_examples"] == conftest.TINY_TEST


def _lock_waiters(lock_path: pathlib.Path) -> int:
    """How many requests wait for the flock on `lock_path` (`->` lines in /proc/locks)."""
    stat = os.stat(lock_path)
    inode = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    with open("/proc/locks") as locks:
        return sum(1 for line in locks if "->" in line and f" {inode} " in line)


def _output(run: spawn.Process) -> str:
    """What `run` printed (stdout and stderr), once it has ended."""
    assert run.stdout is not None
    output = run.stdout.read().decode(errors="replace")
    run.wait(timeout=300)
    return output


@pytest.fixture(scope="module")
def taking_turns(tiny_sources, tmp_path_factory) -> dict:
    """Two processes preparing fashion_mnist_scaled/x2 in one empty data_dir at once: both find
    nothing prepared and wait for the lock held here; once it is freed one builds and the other
    reuses that build (no race in TFDS's folder rename). Their outputs and exit codes, and
    the data_dir."""
    data_dir = tmp_path_factory.mktemp("taking-turns") / "tfds"
    data_dir.mkdir()
    lock_path = data_dir / sources.PREPARE_LOCK
    program = [sys.executable, "-m", "tests.preprocess.prepare_program"]
    argv = [*program, "fashion_mnist_scaled/x2", str(data_dir), *tiny_sources]
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        runs = [
            spawn.popen(
                argv,
                cwd=str(factories.PROJECT_ROOT),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for _ in range(2)
        ]
        try:
            wait_until(
                lambda: _lock_waiters(lock_path) == 2,
                timeout=120,
                failure=lambda: f"{_lock_waiters(lock_path)} of 2 runs wait for the lock",
                alive=lambda: all(run.poll() is None for run in runs),
            )
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    outputs = [_output(run) for run in runs]
    return {
        "data_dir": data_dir,
        "outputs": outputs,
        "returncodes": [run.returncode for run in runs],
    }


@pytest.mark.slow
def test_runs_preparing_one_data_dir_at_once_take_turns(tiny_sources, taking_turns):
    outputs = taking_turns["outputs"]
    assert taking_turns["returncodes"] == [0, 0], outputs
    assert all("prepared" in output for output in outputs)
    reused = build(tiny_sources, taking_turns["data_dir"], factor=2)
    assert len(examples(reused, "train")) == 2 * conftest.TINY_TRAIN
