"""Daily drops: the make_drops tool, the rolling window, the manifest's record of what went in,
and the one-line refusals of bad drops."""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil

import numpy as np
import pytest
import tensorflow as tf

from contract import layout, records
from contract.messages import EXIT_BAD_INPUT
from preprocess import PreprocessConfig, drops, make_drops, run_preprocess, transforms
from preprocess import __main__ as cli
from preprocess.errors import BadInputError
from tests import factories

START = "2026-01-01"
PER_DAY = 60
TEST_EXAMPLES = 40


@pytest.fixture(scope="module")
def drop_folder(tmp_path_factory) -> pathlib.Path:
    """Three daily drops of 60 real Fashion-MNIST images from 2026-01-01 and a 40-image test."""
    out = tmp_path_factory.mktemp("drops") / "drops"
    make_drops.make_drops(
        str(out), 3, START, seed=0, per_day=PER_DAY, test_examples=TEST_EXAMPLES,
        source_dir=str(factories.FASHION_MNIST_DIR),
    )  # fmt: skip
    return out


def dataset(folder: pathlib.Path, test: bool = True) -> str:
    value = f"drops:train={folder}/{{YYYY}}-{{MM}}-{{DD}}/*.tfrecord"
    return value + (f",test={folder}/test/*.tfrecord" if test else "")


def config(tmp_path: pathlib.Path, value: str, **overrides) -> PreprocessConfig:
    values = {
        "output_root": str(tmp_path / "runs"),
        "date": "2026-01-03",
        "dataset": value,
        "num_workers": 2,
        "raw_image_shape": "28x28x1",
        "window_days": 2,
        "read_chunk_size": 50,
        "batch_size": 25,
    }
    return PreprocessConfig(**(values | overrides))


def read_examples(path: pathlib.Path) -> list[tuple[bytes, int]]:
    out = []
    for record in tf.data.TFRecordDataset(str(path)).as_numpy_iterator():
        example = tf.train.Example.FromString(record)
        features = example.features.feature
        out.append(
            (
                features[records.IMAGE_KEY].bytes_list.value[0],
                features[records.LABEL_KEY].int64_list.value[0],
            )
        )
    return out


def read_days(path: str) -> dict[bytes, str | None]:
    """Image bytes -> the day a shard file's record of it carries (None: no day)."""
    out = {}
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        features = tf.train.Example.FromString(record).features.feature
        day = features[records.DAY_KEY].bytes_list.value if records.DAY_KEY in features else []
        out[features[records.IMAGE_KEY].bytes_list.value[0]] = day[0].decode() if day else None
    return out


def drop_days(folder: pathlib.Path) -> dict[bytes, str]:
    """Image bytes -> the day of the drop that delivered it."""
    return {
        image: day.name
        for day in folder.iterdir()
        if day.name != "test"
        for image, _ in read_examples(day / "part-00000.tfrecord")
    }


def split_days(cfg: PreprocessConfig, doc: dict, split: str) -> dict[bytes, str | None]:
    from contract import manifest

    data_dir = layout.data_dir(cfg.output_root, cfg.date)
    return {
        k: v for p in manifest.split_paths(data_dir, doc, split) for k, v in read_days(p).items()
    }


def test_make_drops_deals_the_train_split_into_seeded_dated_drops(drop_folder, tmp_path):
    assert sorted(p.name for p in drop_folder.iterdir()) == [
        "2026-01-01", "2026-01-02", "2026-01-03", "test",
    ]  # fmt: skip
    days = [read_examples(drop_folder / d / "part-00000.tfrecord") for d in
            ("2026-01-01", "2026-01-02", "2026-01-03")]  # fmt: skip
    assert [len(d) for d in days] == [PER_DAY] * 3
    # Real train images, no image in two drops, and a test split of the real test images.
    images, labels = factories.fashion_mnist_arrays("train", 60_000)
    train = {(images[i].tobytes(), int(labels[i])) for i in range(len(labels))}
    dealt = [example for day in days for example in day]
    assert set(dealt) <= train and len(set(dealt)) == 3 * PER_DAY
    test_images, test_labels = factories.fashion_mnist_arrays("test", TEST_EXAMPLES)
    assert read_examples(drop_folder / "test" / "test-00000.tfrecord") == [
        (image.tobytes(), int(label)) for image, label in zip(test_images, test_labels, strict=True)
    ]
    # Seeded: the same seed deals the same drops, another seed others.
    again, other = tmp_path / "again", tmp_path / "other"
    for out, seed in ((again, 0), (other, 1)):
        make_drops.make_drops(str(out), 3, START, seed=seed, per_day=PER_DAY, test_examples=1,
                              source_dir=str(factories.FASHION_MNIST_DIR))  # fmt: skip
    first = drop_folder / "2026-01-01" / "part-00000.tfrecord"
    assert (again / "2026-01-01" / "part-00000.tfrecord").read_bytes() == first.read_bytes()
    assert (other / "2026-01-01" / "part-00000.tfrecord").read_bytes() != first.read_bytes()


def test_make_drops_refuses_an_existing_folder_in_one_line(drop_folder, capsys):
    before = sorted(p.name for p in drop_folder.iterdir())
    code = make_drops.main(["--out", str(drop_folder), "--days", "2", "--start", START])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT and err.count("\n") == 1
    assert err.startswith(f"error: --out {drop_folder} exists")
    assert sorted(p.name for p in drop_folder.iterdir()) == before
    assert not list(drop_folder.parent.glob("drops.tmp-*"))


def test_window_takes_the_last_days_up_to_the_run_date(drop_folder, tmp_path):
    window = drops.select_window(dataset(drop_folder)[len("drops:") :], config(tmp_path, ""))
    assert window.days == ["2026-01-02", "2026-01-03"] and window.missing_days == []
    assert [day for _, day in window.files["train"]] == ["2026-01-02", "2026-01-03"]
    assert [day for _, day in window.files["test"]] == [None]


def test_a_missing_earlier_day_is_warned_about_and_left_out(drop_folder, tmp_path, capsys):
    cfg = config(tmp_path, "", date="2026-01-02", window_days=3)
    window = drops.select_window(dataset(drop_folder)[len("drops:") :], cfg)
    assert window.days == ["2025-12-31", "2026-01-01", "2026-01-02"]
    assert window.missing_days == ["2025-12-31"]
    assert [day for _, day in window.files["train"]] == ["2026-01-01", "2026-01-02"]
    assert "NOTICE drops: no files for 2025-12-31 in the 3-day window" in capsys.readouterr().out


def test_manifest_lists_the_days_and_files_with_their_sha256(drop_folder, tmp_path):
    cfg = config(tmp_path, dataset(drop_folder), date="2026-01-02", window_days=2)
    doc = run_preprocess(cfg, ["--direct_num_workers=1"])
    section = doc["drops"]
    assert section["days"] == ["2026-01-01", "2026-01-02"]
    assert section["days_read"] == ["2026-01-01", "2026-01-02"] and section["missing_days"] == []
    assert section["window_days"] == 2
    listed = {(f["split"], f["date"], f["path"]): f for f in section["files"]}
    expected = {
        ("test", None, str(drop_folder / "test" / "test-00000.tfrecord")),
        ("train", "2026-01-01", str(drop_folder / "2026-01-01" / "part-00000.tfrecord")),
        ("train", "2026-01-02", str(drop_folder / "2026-01-02" / "part-00000.tfrecord")),
    }
    assert set(listed) == expected
    for (_, _, path), entry in listed.items():
        assert entry["sha256"] == hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()
    assert [listed[k]["num_examples"] for k in sorted(expected)] == [
        TEST_EXAMPLES,
        PER_DAY,
        PER_DAY,
    ]
    # Two days went in; the fixed test files are the eval split.
    held = doc["splits"]["train"]["num_examples"] + doc["splits"]["validation"]["num_examples"]
    assert held == 2 * PER_DAY and doc["splits"]["eval"]["num_examples"] == TEST_EXAMPLES
    assert doc["dataset"]["adapter"] == "drops"
    # Every record of a dated drop carries its day; the undated test files' records none.
    assert records.DAY_KEY in doc["feature_spec"]
    delivered = drop_days(drop_folder)
    trained = split_days(cfg, doc, "train") | split_days(cfg, doc, "validation")
    assert len(trained) == 2 * PER_DAY
    assert trained == {image: delivered[image] for image in trained}
    assert set(split_days(cfg, doc, "eval").values()) == {None}


def run_cli(cfg: PreprocessConfig, capsys, *flags: str) -> str:
    """Runs the stage's command line, expecting a one-line refusal and nothing written."""
    argv = ["run", f"--output_root={cfg.output_root}", f"--date={cfg.date}",
            f"--dataset={cfg.dataset}", "--num_workers=1", "--raw_image_shape=28x28x1",
            *flags]  # fmt: skip
    assert cli.main(argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    run_dir = layout.run_dir(cfg.output_root, cfg.date)
    assert not os.path.exists(run_dir) or not [n for n in os.listdir(run_dir) if "data" in n]
    return err.strip()


def test_todays_drop_missing_fails_in_one_line(drop_folder, tmp_path, capsys):
    err = run_cli(config(tmp_path, dataset(drop_folder), date="2026-01-04"), capsys,
                  "--window_days=3")  # fmt: skip
    assert err.startswith("error: no drop for the run's date 2026-01-04: nothing matches ")
    assert "2026-01-04/*.tfrecord" in err and "never reused" in err


def test_a_pattern_without_a_date_placeholder_is_refused(drop_folder, tmp_path, capsys):
    cfg = config(tmp_path, f"drops:{drop_folder}/2026-01-01/*.tfrecord")
    err = run_cli(cfg, capsys, "--window_days=2")
    assert "has no date placeholder" in err and "{YYYY}" in err
    # A window asked of an undated dataset is refused too.
    err = run_cli(config(tmp_path, f"tfrecord:{drop_folder}/2026-01-01/*"), capsys,
                  "--window_days=2")  # fmt: skip
    assert err.startswith("error: window_days 2 needs a dated dataset")


def test_a_window_of_zero_days_is_refused(drop_folder, tmp_path, capsys):
    err = run_cli(config(tmp_path, dataset(drop_folder)), capsys, "--window_days=0")
    assert err == "error: window_days must be at least 1 (the run's own day), got 0"


def test_a_window_of_a_million_days_is_one_line(drop_folder, tmp_path, capsys):
    err = run_cli(config(tmp_path, dataset(drop_folder)), capsys, "--window_days=1000000")
    assert err == "error: window_days must be at most 3653 (ten years of daily drops), got 1000000"


@pytest.fixture
def one_bad_day(drop_folder, tmp_path) -> pathlib.Path:
    """A copy of the drops whose 2026-01-03 folder the test fills."""
    folder = tmp_path / "drops"
    shutil.copytree(drop_folder, folder)
    shutil.rmtree(folder / "2026-01-03")
    (folder / "2026-01-03").mkdir()
    return folder


def write(path: pathlib.Path, examples: list[tf.train.Example]) -> None:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for example in examples:
            writer.write(example.SerializeToString())


def example(image: tf.train.Feature, label: tf.train.Feature) -> tf.train.Example:
    return tf.train.Example(
        features=tf.train.Features(feature={records.IMAGE_KEY: image, records.LABEL_KEY: label})
    )


def test_a_drop_with_a_wrong_feature_type_is_named(one_bad_day, tmp_path, capsys):
    bad = one_bad_day / "2026-01-03" / "part-00000.tfrecord"
    image = tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes(784)]))
    write(bad, [example(image, tf.train.Feature(float_list=tf.train.FloatList(value=[1.0])))])
    err = run_cli(config(tmp_path, dataset(one_bad_day)), capsys, "--window_days=2")
    assert err.startswith(f"error: TFRecord file {bad}: label feature 'label' is float_list")


def test_a_drop_with_a_wrong_image_shape_is_named(one_bad_day, tmp_path, capsys):
    bad = one_bad_day / "2026-01-03" / "part-00000.tfrecord"
    small = np.zeros((14, 14, 1), np.uint8)
    write(bad, [tf.train.Example.FromString(records.encode_example(small, 3))])
    err = run_cli(config(tmp_path, dataset(one_bad_day)), capsys, "--window_days=2")
    assert err.startswith(f"error: a record of {bad} holds 196 image bytes")
    assert "holds 196 image bytes, raw_image_shape 28x28x1 needs 784" in err


def test_a_corrupt_drop_is_named(one_bad_day, tmp_path, capsys):
    bad = one_bad_day / "2026-01-03" / "part-00000.tfrecord"
    good = (one_bad_day / "2026-01-02" / "part-00000.tfrecord").read_bytes()
    bad.write_bytes(good[:100] + b"\xff" * 50 + good[150:])
    err = run_cli(config(tmp_path, dataset(one_bad_day)), capsys, "--window_days=2")
    assert err.startswith(f"error: TFRecord file {bad} is not readable")


def test_an_unknown_placeholder_is_refused(tmp_path):
    with pytest.raises(BadInputError, match=r"unknown placeholder \{YY\}"):
        drops.select_window("d/{YY}-{MM}-{DD}/*", config(tmp_path, ""))


def split_images(cfg: PreprocessConfig, doc: dict, *splits: str) -> set[bytes]:
    """The image bytes of every record of a shard set's splits."""
    from contract import manifest

    data_dir = layout.data_dir(cfg.output_root, cfg.date)
    paths = [p for split in splits for p in manifest.split_paths(data_dir, doc, split)]
    return {image for path in paths for image, _ in read_examples(pathlib.Path(path))}


def test_a_held_out_eval_split_never_takes_an_earlier_nights_training_images(drop_folder, tmp_path):
    # No fixed test files: each night holds its eval split out of a two-day window, and the
    # windows of 2026-01-02 and 2026-01-03 share the drop of 2026-01-02.
    nights = []
    for date in ("2026-01-02", "2026-01-03"):
        cfg = config(tmp_path, dataset(drop_folder, test=False), date=date, eval_fraction=0.3)
        nights.append((cfg, run_preprocess(cfg, ["--direct_num_workers=1"])))
    (first, first_doc), (second, second_doc) = nights
    trained = [split_images(c, d, "train", "validation") for c, d in nights]
    held = [split_images(c, d, "eval") for c, d in nights]
    assert not held[1] & trained[0]  # night 2's eval holds none of night 1's training images
    assert not held[0] & trained[1]  # and what night 1 held out stays out of training
    shared = {
        image for image, _ in read_examples(drop_folder / "2026-01-02" / "part-00000.tfrecord")
    }
    assert held[0] & shared == held[1] & shared != set()
    delivered = drop_days(drop_folder)
    for (cfg, doc), images in zip(nights, held, strict=True):
        # Each held-out example carries the day of the drop its image came from.
        days = split_days(cfg, doc, "eval")
        assert days == {image: delivered[image] for image in images}
        assert set(days.values()) == set(doc["drops"]["days_read"])
        assert doc["splits"]["eval"]["num_examples"] == len(images)
        assert doc["dataset"]["eval_held_out"]["chosen_by"] == "image sha256"
        assert doc["dataset"]["eval_split"] == "held-out 30% of train by image sha256"
        assert doc["splits"]["eval"]["duplicates_in_training"] == 0
        kept = doc["splits"]["train"]["num_examples"] + doc["splits"]["validation"]["num_examples"]
        assert kept + len(images) == 2 * PER_DAY


def test_make_drops_lists_each_folders_files_with_their_sha256(drop_folder):
    for folder in ("2026-01-01", "test"):
        sums = (drop_folder / folder / make_drops.SUMS_FILE).read_text().splitlines()
        (name,) = [line.split("  ")[1] for line in sums]
        digest = hashlib.sha256((drop_folder / folder / name).read_bytes()).hexdigest()
        assert sums == [f"{digest}  {name}"]


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        ("cut-between-records", "fails its sha256 in "),
        ("unlisted-file", "is not listed in "),
        ("listed-file-missing", "lists part-00001.tfrecord, not in "),
    ],
)
def test_a_drop_that_is_not_what_its_sums_say_is_refused(
    drop_folder, tmp_path, capsys, spoil, message
):
    folder = tmp_path / "drops"
    shutil.copytree(drop_folder, folder)
    day = folder / "2026-01-03"
    drop = day / "part-00000.tfrecord"
    if spoil == "cut-between-records":
        # The first 20 records whole: still valid TFRecord, so only the sums can tell.
        data = drop.read_bytes()
        drop.write_bytes(data[: transforms.record_offsets(data)[20]])
        assert len(read_examples(drop)) == 20
    elif spoil == "unlisted-file":
        shutil.copy(folder / "2026-01-02" / "part-00000.tfrecord", day / "part-00009.tfrecord")
    else:
        sums = day / make_drops.SUMS_FILE
        sums.write_text(sums.read_text() + f"{'0' * 64}  part-00001.tfrecord\n")
    err = run_cli(config(tmp_path, dataset(folder)), capsys, "--window_days=2")
    assert message in err, err
