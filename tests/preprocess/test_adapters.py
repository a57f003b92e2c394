"""The dataset adapters and splits through the real Beam job: image folders, TFRecord files,
TFDS split syntax, the held-out eval split, and the one-line refusals of bad input."""

from __future__ import annotations

import collections
import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from contract import layout, manifest, records
from contract.messages import EXIT_BAD_INPUT
from preprocess import PreprocessConfig, run_preprocess
from preprocess import __main__ as cli
from preprocess.errors import BadInputError

CLASSES = ("cat", "dog", "emu")
PER_CLASS = 10


def pixels(label: int, index: int, size: int = 8, channels: int = 3) -> np.ndarray:
    """A distinct image per (class, index)."""
    rng = np.random.default_rng(100 * label + index)
    return rng.integers(0, 256, (size, size, channels), dtype=np.uint8)


def write_class_folders(root: pathlib.Path, per_class: int = PER_CLASS, first: int = 0) -> None:
    """root/<class>/NN.png, 8x8 RGB, `per_class` per class; images from index `first` on."""
    for label, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(first, first + per_class):
            png = tf.io.encode_png(pixels(label, i)).numpy()
            (root / name / f"{i:02d}.png").write_bytes(png)


@pytest.fixture(scope="module")
def flat_folder(tmp_path_factory) -> pathlib.Path:
    """30 PNGs in three class folders, no split folders."""
    root = tmp_path_factory.mktemp("flat")
    write_class_folders(root)
    return root


def config(tmp_path: pathlib.Path, dataset: str, **overrides) -> PreprocessConfig:
    values = {
        "output_root": str(tmp_path / "runs"),
        "date": "2026-01-31",
        "dataset": dataset,
        "num_workers": 2,
        "read_chunk_size": 8,
        "batch_size": 5,
    }
    return PreprocessConfig(**(values | overrides))


def split_examples(cfg: PreprocessConfig, doc: dict, split: str) -> list[tuple[bytes, int]]:
    """(image bytes, label) of every record of a split, sorted."""
    paths = manifest.split_paths(layout.data_dir(cfg.output_root, cfg.date), doc, split)
    out = []
    for batch in tf.data.TFRecordDataset(paths).batch(1000):
        images, labels = records.parse_batch(batch, doc["image_shape"])
        out += zip((i.tobytes() for i in images.numpy()), labels.numpy().tolist(), strict=True)
    return sorted(out)


def source_examples(indices=range(PER_CLASS)) -> list[tuple[bytes, int]]:
    return sorted((pixels(c, i).tobytes(), c) for c in range(len(CLASSES)) for i in indices)


def test_image_folder_without_a_test_split_holds_out_eval_by_the_seed(flat_folder, tmp_path):
    cfg = config(tmp_path, f"imagefolder:{flat_folder}")
    doc = run_preprocess(cfg)
    assert manifest.verify(layout.data_dir(cfg.output_root, cfg.date)) == doc
    assert doc["class_names"] == list(CLASSES) and doc["image_shape"] == [8, 8, 3]
    assert doc["dataset"]["adapter"] == "imagefolder"
    assert doc["dataset"]["name"] == f"imagefolder:{flat_folder}"
    assert doc["dataset"]["eval_split"] == "held-out 10% of train (seed 0)"
    assert doc["dataset"]["eval_held_out"]["fraction"] == 0.1
    # 30 images: 3 held out for eval, 3 of the other 27 for validation, 24 / 2 workers.
    assert doc["splits"]["eval"] == {"num_examples": 3, "duplicates_in_training": 0}
    assert doc["splits"]["train"]["examples_per_worker"] == 12
    assert doc["splits"]["validation"]["num_examples"] == 3
    # Every source image lands exactly once, with its class, across the three splits.
    written = [e for split in layout.SPLITS for e in split_examples(cfg, doc, split)]
    assert sorted(written) == source_examples()
    # Another seed cuts another eval split; the same seed the same one.
    other = run_preprocess(config(tmp_path, cfg.dataset, date="2026-02-01", seed=1))
    again = run_preprocess(config(tmp_path, cfg.dataset, date="2026-02-02"))
    first = split_examples(cfg, doc, "eval")
    second = split_examples(config(tmp_path, cfg.dataset, date="2026-02-01"), other, "eval")
    third = split_examples(config(tmp_path, cfg.dataset, date="2026-02-02"), again, "eval")
    assert first == third and first != second
    assert other["dataset"]["eval_split"] == "held-out 10% of train (seed 1)"


def test_image_folder_with_split_folders_and_split_syntax(tmp_path):
    root = tmp_path / "tree"
    write_class_folders(root / "train", per_class=8)
    write_class_folders(root / "test", per_class=2, first=8)
    cfg = config(tmp_path, f"imagefolder:{root}", train_split="train[:75%]", num_workers=1)
    doc = run_preprocess(cfg)
    assert doc["class_names"] == list(CLASSES)
    assert doc["dataset"]["eval_split"] == "test" and "eval_held_out" not in doc["dataset"]
    assert split_examples(cfg, doc, "eval") == source_examples(range(8, 10))
    # train[:75%] of the 24 listed images (classes in order): 18, all of cat and dog, 2 emus.
    held = split_examples(cfg, doc, "train") + split_examples(cfg, doc, "validation")
    assert collections.Counter(label for _, label in held) == {0: 8, 1: 8, 2: 2}


def test_resize_brings_mixed_sizes_to_one(tmp_path):
    root = tmp_path / "mixed"
    write_class_folders(root, per_class=4)
    big = tf.io.encode_jpeg(pixels(1, 9, size=12)).numpy()
    (root / "dog" / "big.jpg").write_bytes(big)
    cfg = config(tmp_path, f"imagefolder:{root}", resize="6x5", num_workers=1)
    doc = run_preprocess(cfg)
    assert doc["image_shape"] == [6, 5, 3]
    assert sum(doc["splits"][s]["num_examples"] for s in layout.SPLITS) == 13


def write_tfrecords(path: pathlib.Path, examples: list[dict[str, tf.train.Feature]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for feature in examples:
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())


def _bytes(value: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int(value: int) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def encoded_examples(indices, label_of=_int) -> list[dict[str, tf.train.Feature]]:
    return [
        {"img": _bytes(tf.io.encode_png(pixels(c, i)).numpy()), "cls": label_of(c)}
        for i in indices
        for c in range(len(CLASSES))
    ]


def test_tfrecord_files_with_named_features_and_splits(tmp_path):
    data = tmp_path / "records"
    write_tfrecords(data / "train-0.tfrecord", encoded_examples(range(0, 5)))
    write_tfrecords(data / "train-1.tfrecord", encoded_examples(range(5, 8)))
    write_tfrecords(data / "test-0.tfrecord", encoded_examples(range(8, 10)))
    dataset = f"tfrecord:train={data}/train-*.tfrecord,test={data}/test-*.tfrecord"
    cfg = config(tmp_path, dataset, image_feature="img", label_feature="cls")
    doc = run_preprocess(cfg)
    assert doc["class_names"] == ["0", "1", "2"] and doc["dataset"]["adapter"] == "tfrecord"
    assert doc["dataset"]["version"].startswith("3 files, 30 records")
    assert split_examples(cfg, doc, "eval") == source_examples(range(8, 10))
    held = split_examples(cfg, doc, "train") + split_examples(cfg, doc, "validation")
    assert sorted(held) == source_examples(range(8))


def test_tfrecord_class_names_and_raw_pixels(tmp_path):
    """Labels as bytes class names; images as raw pixels (the shard format's own features)."""
    data = tmp_path / "raw.tfrecord"
    write_tfrecords(
        data,
        [
            {"image": _bytes(pixels(c, i).tobytes()), "label": _bytes(CLASSES[c].encode())}
            for i in range(PER_CLASS)
            for c in (2, 0, 1)
        ],
    )
    cfg = config(tmp_path, f"tfrecord:{data}", raw_image_shape="8x8x3", eval_fraction=0.2)
    doc = run_preprocess(cfg)
    assert doc["class_names"] == list(CLASSES) and doc["splits"]["eval"]["num_examples"] == 6
    written = [e for split in layout.SPLITS for e in split_examples(cfg, doc, split)]
    assert sorted(written) == source_examples()


def test_tfds_split_syntax(make_config):
    cfg = make_config(train_split="train[:50%]", eval_split="test[10:30]", num_workers=2)
    doc = run_preprocess(cfg)
    assert doc["splits"]["eval"]["num_examples"] == 20
    assert doc["parameters"]["train_split"] == "train[:50%]"
    held = doc["splits"]["train"]["num_examples"] + doc["splits"]["validation"]["num_examples"]
    assert held == 150 and doc["dataset"]["eval_split"] == "test[10:30]"


def run_cli(cfg: PreprocessConfig, capsys, *flags: str) -> str:
    argv = ["run", f"--output_root={cfg.output_root}", f"--date={cfg.date}"]
    argv += [f"--dataset={cfg.dataset}", "--num_workers=1", *flags]
    assert cli.main(argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    run_dir = layout.run_dir(cfg.output_root, cfg.date)
    assert not os.path.exists(layout.join(layout.data_dir(cfg.output_root, cfg.date)))
    assert not os.path.exists(run_dir) or not [n for n in os.listdir(run_dir) if "data" in n]
    return err.strip()


def test_unknown_adapter_is_refused(tmp_path, capsys):
    err = run_cli(config(tmp_path, "imgfolder:/data/pets"), capsys)
    assert err.startswith("error: unknown dataset adapter 'imgfolder' in --dataset imgfolder:")
    assert "imagefolder:" in err and "tfrecord:" in err


def test_image_folder_with_one_class_is_refused(tmp_path, capsys):
    root = tmp_path / "one"
    write_class_folders(root, per_class=3)
    for name in CLASSES[1:]:
        for path in (root / name).iterdir():
            path.unlink()
        (root / name).rmdir()
    err = run_cli(config(tmp_path, f"imagefolder:{root}"), capsys)
    assert err == (
        f"error: image folder {root} has 1 class folder ('cat'): a classifier needs at least "
        f"two, one folder per class ({root}/<class name>/<image>)"
    )


def test_mixed_image_sizes_without_resize_name_two_files(tmp_path, capsys):
    root = tmp_path / "mixed"
    write_class_folders(root, per_class=3)
    (root / "emu" / "wide.png").write_bytes(tf.io.encode_png(pixels(2, 7, size=6)).numpy())
    err = run_cli(config(tmp_path, f"imagefolder:{root}"), capsys)
    assert err == (
        f"error: images differ in size: {root}/cat/00.png is 8x8, {root}/emu/wide.png is 6x6: "
        "pass --resize HxW (e.g. --resize 8x8) to bring every image to one size"
    )


def test_missing_label_feature_names_the_file(tmp_path, capsys):
    data = tmp_path / "records"
    write_tfrecords(data / "a.tfrecord", encoded_examples(range(3)))
    write_tfrecords(data / "b.tfrecord", [{"img": e["img"]} for e in encoded_examples(range(2))])
    cfg = config(tmp_path, f"tfrecord:{data}/*.tfrecord")
    err = run_cli(cfg, capsys, "--image_feature=img", "--label_feature=cls")
    assert err == (
        f"error: a record of TFRecord file {data}/b.tfrecord has no label feature 'cls': "
        "every record needs the image and the label"
    )


def test_a_bad_split_expression_is_refused(flat_folder, tmp_path):
    with pytest.raises(BadInputError, match=r"has no split 'tran'; it has train \(30 examples\)"):
        run_preprocess(config(tmp_path, f"imagefolder:{flat_folder}", train_split="tran"))
