"""Data that cannot leak between splits: a source file read for both the training data and the
eval split is refused before the Beam job; eval images also in the training data are counted in
the job, recorded in the manifest and refused above max_eval_overlap."""

from __future__ import annotations

import os
import pathlib
import shutil

import apache_beam as beam
import numpy as np
import pytest
import tensorflow as tf
from apache_beam.runners.portability.fn_api_runner import fn_runner
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from contract import layout, records
from contract.messages import EXIT_BAD_INPUT
from preprocess import PreprocessConfig, eval_overlap, pipeline, run_preprocess
from preprocess import __main__ as cli
from preprocess.errors import BadInputError

SHAPE = (8, 8, 1)


def image(index: int) -> np.ndarray:
    """A distinct 8x8 grey image per index."""
    return np.random.default_rng(index).integers(0, 256, SHAPE, dtype=np.uint8)


def write_examples(path: pathlib.Path, indices, label_of=lambda i: i % 3) -> pathlib.Path:
    """A TFRecord file of the shard format: image `i` with label `label_of(i)` per index."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in indices:
            writer.write(records.encode_example(image(i), label_of(i)))
    return path


def config(tmp_path: pathlib.Path, dataset: str, **overrides) -> PreprocessConfig:
    values = {
        "output_root": str(tmp_path / "runs"),
        "date": "2026-01-31",
        "dataset": dataset,
        "num_workers": 2,
        "raw_image_shape": "8x8x1",
        "read_chunk_size": 16,
        "batch_size": 8,
    }
    return PreprocessConfig(**(values | overrides))


@pytest.fixture
def no_beam(monkeypatch):
    """Fails the test if the Beam job is started."""

    def started(options):
        raise AssertionError("the Beam job ran")

    monkeypatch.setattr(pipeline, "_make_pipeline", started)


def assert_nothing_written(cfg: PreprocessConfig) -> None:
    """No shard set, complete or staged (the command line's run lock may be there)."""
    run_dir = layout.run_dir(cfg.output_root, cfg.date)
    assert not os.path.exists(run_dir) or not [n for n in os.listdir(run_dir) if "data" in n]


def test_a_file_matched_by_both_splits_is_refused_before_the_job(tmp_path, no_beam):
    folder = tmp_path / "records"
    write_examples(folder / "a.tfrecord", range(20))
    shared = write_examples(folder / "b.tfrecord", range(20, 30))
    cfg = config(tmp_path, f"tfrecord:train={folder}/*.tfrecord,test={shared}")
    with pytest.raises(BadInputError) as refused:
        run_preprocess(cfg)
    assert str(refused.value).startswith(
        f"source file {shared} is read for both the training data (split 'train') and the "
        "eval split ('test')"
    )
    assert_nothing_written(cfg)


def test_a_copy_of_a_training_file_in_the_eval_split_is_refused_by_its_bytes(tmp_path, no_beam):
    train = write_examples(tmp_path / "train" / "a.tfrecord", range(20))
    write_examples(tmp_path / "train" / "b.tfrecord", range(20, 30))
    copy = tmp_path / "test" / "copy.tfrecord"
    copy.parent.mkdir()
    shutil.copyfile(train, copy)
    cfg = config(tmp_path, f"tfrecord:train={tmp_path}/train/*,test={tmp_path}/test/*")
    with pytest.raises(BadInputError) as refused:
        run_preprocess(cfg)
    message = str(refused.value)
    assert message.startswith(
        f"source files {train} (training data, split 'train') and {copy} (eval split 'test') "
        "hold the same bytes (sha256 "
    )
    assert "\n" not in message
    assert_nothing_written(cfg)


def test_an_image_file_copied_into_the_test_folder_is_refused(tmp_path, no_beam):
    root = tmp_path / "tree"
    for split, indices in (("train", range(6)), ("test", range(6, 8))):
        for i in indices:
            folder = root / split / ("cat", "dog")[i % 2]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i}.png").write_bytes(tf.io.encode_png(image(i)).numpy())
    shutil.copyfile(root / "train" / "dog" / "3.png", root / "test" / "dog" / "copied.png")
    cfg = config(tmp_path, f"imagefolder:{root}", raw_image_shape="", num_workers=1)
    with pytest.raises(BadInputError, match="hold the same bytes") as refused:
        run_preprocess(cfg)
    assert f"{root}/train/dog/3.png (training data, split 'train')" in str(refused.value)
    assert f"{root}/test/dog/copied.png (eval split 'test')" in str(refused.value)


def test_a_drop_copied_into_the_fixed_test_files_is_refused(tmp_path, no_beam):
    drops = tmp_path / "drops"
    day = write_examples(drops / "2026-01-31" / "part-00000.tfrecord", range(30))
    (drops / "test").mkdir()
    shutil.copyfile(day, drops / "test" / "test-00000.tfrecord")
    dataset = f"drops:train={drops}/{{YYYY}}-{{MM}}-{{DD}}/*.tfrecord,test={drops}/test/*"
    with pytest.raises(BadInputError, match=f"source files {day} .* hold the same bytes"):
        run_preprocess(config(tmp_path, dataset))


def test_one_file_cut_into_disjoint_halves_for_the_two_splits_is_allowed(tmp_path):
    only = write_examples(tmp_path / "all.tfrecord", range(40))
    cfg = config(tmp_path, f"tfrecord:{only}", train_split="train[:50%]", eval_split="train[50%:]")
    doc = run_preprocess(cfg)
    assert doc["splits"]["eval"] == {"num_examples": 20, "duplicates_in_training": 0}


@pytest.fixture
def overlapping(tmp_path) -> str:
    """A train file of images 0-39 and a test file of images 40-49 and copies of 3, 7 and 11
    (one of them under another label)."""
    write_examples(tmp_path / "train" / "a.tfrecord", range(40))
    write_examples(tmp_path / "test" / "b.tfrecord", [*range(40, 50), 3, 7, 11],
                   label_of=lambda i: (i + 1) % 3 if i == 11 else i % 3)  # fmt: skip
    return f"tfrecord:train={tmp_path}/train/*,test={tmp_path}/test/*"


def test_eval_images_also_in_the_training_data_are_refused_and_nothing_is_published(
    tmp_path, overlapping
):
    cfg = config(tmp_path, overlapping)
    with pytest.raises(BadInputError) as refused:
        run_preprocess(cfg)
    assert str(refused.value) == (
        "the eval split holds 3 examples whose image is also in the training data (train and "
        "validation), more than max_eval_overlap 0: remove them from one side, or raise "
        "--max_eval_overlap; nothing published"
    )
    assert_nothing_written(cfg)


def test_the_command_line_refuses_eval_overlap_in_one_line(tmp_path, overlapping, capsys):
    cfg = config(tmp_path, overlapping)
    argv = ["run", f"--output_root={cfg.output_root}", f"--date={cfg.date}",
            f"--dataset={cfg.dataset}", "--raw_image_shape=8x8x1", "--num_workers=1"]  # fmt: skip
    assert cli.main(argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: the eval split holds 3 examples")
    assert_nothing_written(cfg)


def test_the_count_is_recorded_and_overlap_up_to_the_limit_passes(tmp_path, overlapping):
    doc = run_preprocess(config(tmp_path, overlapping, max_eval_overlap=3))
    assert doc["splits"]["eval"] == {"num_examples": 13, "duplicates_in_training": 3}
    assert doc["parameters"]["max_eval_overlap"] == 3


def test_a_negative_limit_is_refused():
    with pytest.raises(
        BadInputError,
        match=r"max_eval_overlap must be at least 0 \(a number of eval examples\), got -1",
    ):
        PreprocessConfig("runs", "2026-01-31", max_eval_overlap=-1).check()


@pytest.mark.parametrize("bits", [0, 1, 4])
def test_the_count_does_not_depend_on_the_bucketing(tmp_path, bits):
    # Eval image 5 is in train twice and in eval twice (two eval examples); eval image 9 is in
    # validation; eval image 40 is nowhere else; one eval file is empty.
    staging = str(tmp_path)
    files = {
        "train/a.tfrecord": ("train", [1, 2, 5, 5]),
        "train/b.tfrecord": ("train", [3, 4]),
        "validation/v.tfrecord": ("validation", [9, 10]),
        "eval/e0.tfrecord": ("eval", [5, 40, 9]),
        "eval/e1.tfrecord": ("eval", [5]),
        "eval/e2.tfrecord": ("eval", []),
    }
    for path, (_, indices) in files.items():
        write_examples(tmp_path / path, indices)
    entries = [{"path": path, "split": split} for path, (split, _) in files.items()]
    with test_pipeline.TestPipeline(runner=fn_runner.FnApiRunner()) as p:
        counted = p | beam.Create(entries) | eval_overlap.CountEvalDuplicates(staging, bits)
        assert_that(counted, equal_to([{eval_overlap.DUPLICATES_KEY: 3}]))


def test_a_missing_count_is_refused():
    with pytest.raises(Exception, match="listed 0 counts of eval examples"):
        eval_overlap.split_listing([{"path": "eval/e.tfrecord", "split": "eval"}])
