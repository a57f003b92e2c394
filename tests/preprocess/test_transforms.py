"""ShardSplit on in-memory records: ranking, balance, leftovers, duplicates, bundle order."""

from __future__ import annotations

import collections
import functools
import random

import apache_beam as beam
import tensorflow as tf
from apache_beam.runners.portability.fn_api_runner import fn_runner
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that

from contract import layout
from preprocess import plan, transforms

TRAIN_PLAN = functools.partial(
    plan.TrainPlan, num_workers=4, validation_fraction=0.1, max_records_per_file=1000
)


def shard(records: list[bytes], staging: str, batch_size: int, check=None) -> None:
    batches = [records[i : i + batch_size] for i in range(0, len(records), batch_size)]
    with test_pipeline.TestPipeline(runner=fn_runner.FnApiRunner()) as p:
        entries = (
            p
            | "Batches" >> beam.Create(batches, reshuffle=False)
            | "Shard" >> transforms.ShardSplit(TRAIN_PLAN, seed="s", staging_dir=staging)
        )
        if check is not None:
            assert_that(entries, check)


def read(staging: str, path: str) -> list[bytes]:
    return [r.numpy() for r in tf.data.TFRecordDataset(layout.join(staging, path))]


def counts_are(expected: dict[str, int]):
    def check(entries):
        actual = {e["path"]: e["num_examples"] for e in entries}
        assert actual == expected, actual

    return check


def test_balanced_workers_and_leftover_in_validation(tmp_path):
    records = [f"record-{i}".encode() for i in range(103)]
    expected = {layout.worker_file_name(w, 4, 0, 1): 23 for w in range(4)}
    expected[layout.whole_split_file_name("validation", 0, 1)] = 11
    shard(records, str(tmp_path), batch_size=10, check=counts_are(expected))
    written = [r for path in expected for r in read(str(tmp_path), path)]
    assert sorted(written) == sorted(records)
    for path in expected:
        keys = [k for k, _ in transforms.key_records(read(str(tmp_path), path), "s")]
        assert keys == sorted(keys), f"{path} is not in key order"


def test_identical_records_each_get_their_own_rank(tmp_path):
    records = [f"record-{i}".encode() for i in range(95)] + [b"same"] * 8
    expected = {layout.worker_file_name(w, 4, 0, 1): 23 for w in range(4)}
    expected[layout.whole_split_file_name("validation", 0, 1)] = 11
    shard(records, str(tmp_path), batch_size=6, check=counts_are(expected))
    written = collections.Counter(r for path in expected for r in read(str(tmp_path), path))
    assert written == collections.Counter(records)


def test_bundle_arrangement_does_not_change_bytes(tmp_path):
    records = [f"record-{i}".encode() for i in range(103)]
    shuffled = list(records)
    random.Random(1).shuffle(shuffled)
    shard(records, str(tmp_path / "a"), batch_size=7)
    shard(shuffled, str(tmp_path / "b"), batch_size=40)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.tfrecord"))
    assert len(files) == 5
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


def test_seed_changes_the_assignment(tmp_path):
    records = [f"record-{i}".encode() for i in range(103)]
    first = transforms.key_records(records, "s")
    second = transforms.key_records(records, "t")
    assert sorted(first)[0][1] != sorted(second)[0][1]
