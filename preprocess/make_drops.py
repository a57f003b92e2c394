"""Cuts Fashion-MNIST's train split into dated daily drops, so the nightly loop runs offline.

    python -m preprocess.make_drops --out drops --days 3 --start 2026-01-01 --seed 0

writes `drops/2026-01-01/part-00000.tfrecord`, ... (a seeded shuffle of the train split dealt
into the days, every drop of the same size) and `drops/test/test-00000.tfrecord` (the test split,
a fixed evaluation set), as tf.train.Example records of the shard format (raw uint8 `image`,
int64 `label`). Read them with

    --dataset 'drops:train=drops/{YYYY}-{MM}-{DD}/*.tfrecord,test=drops/test/*.tfrecord'
    --raw_image_shape 28x28x1 --window_days N

The source files are the ones `make dataset` places in .cache/fashion-mnist, checked against
their recorded sha256 first. The folder appears whole or not at all, and each of its folders
holds a SHA256SUMS of its files, which preprocess checks the drop against.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
import uuid

import numpy as np

from contract import atomic
from contract.messages import EXIT_BAD_INPUT, EXIT_FAILED, StageArgumentParser, error_line
from preprocess.errors import BadInputError, PreprocessError

SUMS_FILE = "SHA256SUMS"  # a drop's own list of its files and their sha256 (`sha256sum`)

DEFAULT_SOURCE_DIR = ".cache/fashion-mnist"
TEST_FOLDER = "test"
PATTERN = "train={out}/{{YYYY}}-{{MM}}-{{DD}}/*.tfrecord,test={out}/test/*.tfrecord"
SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def read_split(source_dir: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 28, 28, 1) and labels of a Fashion-MNIST split from its checked IDX files.

    Raises:
        PreprocessError: a source file is missing or differs from its recorded sha256.
    """
    from preprocess import sources
    from preprocess.scaled_dataset import read_idx

    sums_path = sources.recorded_checksums_path("fashion_mnist")
    sums = sources.read_sums_file(sums_path)
    names = SPLIT_FILES[split]
    sources.verify_manual_files(source_dir, {n: sums[n] for n in names}, sums_path)
    images = read_idx(os.path.join(source_dir, names[0]))[..., np.newaxis]
    labels = read_idx(os.path.join(source_dir, names[1])).astype(np.int64)
    return images, labels


def write_records(path: str, images: np.ndarray, labels: np.ndarray) -> None:
    """Writes examples in the shard format as one TFRecord file."""
    import tensorflow as tf

    from contract import records

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for image, label in zip(images, labels, strict=True):
            writer.write(records.encode_example(image, int(label)))


def day_indices(num_examples: int, days: int, per_day: int | None, seed: int) -> list[np.ndarray]:
    """Which examples each day's drop holds: a seeded shuffle dealt into equal drops.

    Raises:
        BadInputError: fewer examples than the drops ask for.
    """
    size = per_day if per_day is not None else num_examples // days
    if size < 1 or size * days > num_examples:
        raise BadInputError(
            f"{days} drops of {size} examples need {size * days} examples, the train split has "
            f"{num_examples}: lower --days or --per_day"
        )
    order = np.random.default_rng(seed).permutation(num_examples)
    return [np.sort(order[day * size : (day + 1) * size]) for day in range(days)]


def write_sums(folder: str) -> None:
    """Writes the folder's SHA256SUMS (`sha256sum`'s format): what the drop holds, so that a
    drop cut short or still being copied is refused by preprocess (preprocess.drops)."""
    lines = [
        f"{atomic.sha256_file(os.path.join(folder, name))}  {name}\n"
        for name in sorted(os.listdir(folder))
        if name != SUMS_FILE
    ]
    atomic.write_bytes_atomic(os.path.join(folder, SUMS_FILE), "".join(lines).encode())


def make_drops(
    out: str,
    days: int,
    start: str,
    seed: int = 0,
    per_day: int | None = None,
    test_examples: int | None = None,
    source_dir: str = DEFAULT_SOURCE_DIR,
) -> list[str]:
    """Writes the drops folder; returns the days written.

    Args:
        out: the folder to create (must not exist).
        days: how many daily drops.
        start: the first drop's date, YYYY-MM-DD.
        seed: seeds the shuffle that deals examples into days.
        per_day: examples per drop; default the whole train split dealt evenly.
        test_examples: examples of the test split to write; default all of them.
        source_dir: the folder with Fashion-MNIST's IDX files.

    Raises:
        BadInputError: a bad parameter, or `out` exists.
        PreprocessError: the source files are missing or differ from their sums.
    """
    try:
        first = datetime.date.fromisoformat(start)
    except ValueError:
        raise BadInputError(f"--start must be YYYY-MM-DD, got '{start}'") from None
    if days < 1:
        raise BadInputError(f"--days must be at least 1, got {days}")
    if test_examples is not None and test_examples < 1:
        raise BadInputError(f"--test_examples must be at least 1, got {test_examples}")
    if "://" in out:
        raise BadInputError(f"--out {out}: drops are written to a local folder; copy it after")
    if os.path.lexists(out):
        raise BadInputError(f"--out {out} exists: remove it or name another folder")
    images, labels = read_split(source_dir, "train")
    chosen = day_indices(len(labels), days, per_day, seed)
    test_images, test_labels = read_split(source_dir, "test")
    staging = f"{out.rstrip('/')}.tmp-{uuid.uuid4().hex[:12]}"
    written = []
    try:
        for number, indices in enumerate(chosen):
            day = (first + datetime.timedelta(days=number)).isoformat()
            path = os.path.join(staging, day, "part-00000.tfrecord")
            write_records(path, images[indices], labels[indices])
            write_sums(os.path.dirname(path))
            written.append(day)
        keep = slice(0, test_examples)
        path = os.path.join(staging, TEST_FOLDER, "test-00000.tfrecord")
        write_records(path, test_images[keep], test_labels[keep])
        write_sums(os.path.dirname(path))
        os.rename(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written


def main(argv: list[str] | None = None) -> int:
    """Command line; prints the days written and the --dataset value that reads them."""
    parser = StageArgumentParser(
        prog="python -m preprocess.make_drops",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", required=True, help="folder to create, e.g. drops")
    parser.add_argument("--days", type=int, required=True, help="number of daily drops")
    parser.add_argument("--start", required=True, help="date of the first drop, YYYY-MM-DD")
    parser.add_argument("--seed", type=int, default=0, help="seeds the shuffle into days")
    parser.add_argument(
        "--per_day", type=int, default=None, help="examples per drop (default: 60000 / days)"
    )
    parser.add_argument(
        "--test_examples", type=int, default=None, help="test examples (default: all 10000)"
    )
    parser.add_argument(
        "--source_dir", default=DEFAULT_SOURCE_DIR, help="Fashion-MNIST's IDX files"
    )
    args = parser.parse_args(argv)
    try:
        days = make_drops(
            args.out,
            args.days,
            args.start,
            args.seed,
            args.per_day,
            args.test_examples,
            args.source_dir,
        )
    except BadInputError as e:
        print(error_line(str(e)), file=sys.stderr)
        return EXIT_BAD_INPUT
    except PreprocessError as e:
        print(error_line(str(e)), file=sys.stderr)
        return EXIT_FAILED
    print(f"wrote {len(days)} drops ({days[0]} to {days[-1]}) and a test split to {args.out}")
    print(f"read them with --dataset 'drops:{PATTERN.format(out=args.out)}' "
          "--raw_image_shape 28x28x1 --window_days N")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
