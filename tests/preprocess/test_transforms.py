"""ShardSplits on in-memory records against a plain sort: exact files whatever the bucketing."""

from __future__ import annotations

import collections
import functools
import random

import apache_beam as beam
import pytest
import tensorflow as tf
from apache_beam.runners.portability.fn_api_runner import fn_runner
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that

from contract import layout
from preprocess import plan, transforms


def train_plan(num_workers: int, per_file: int = 1000, validation: float = 0.1):
    return functools.partial(
        plan.TrainPlan,
        num_workers=num_workers,
        validation_fraction=validation,
        max_records_per_file=per_file,
    )


def shard(
    records: list[bytes], staging: str, make_plan, bits: int, batch_size: int = 10, check=None
) -> None:
    batches = [records[i : i + batch_size] for i in range(0, len(records), batch_size)]
    with test_pipeline.TestPipeline(runner=fn_runner.FnApiRunner()) as p:
        source = p | "Batches" >> beam.Create(batches, reshuffle=False)
        entries = {"train": source} | "Shard" >> transforms.ShardSplits(
            {"train": (make_plan, bits)}, seed="s", staging_dir=staging
        )
        if check is not None:
            assert_that(entries, check)


def expected_files(records: list[bytes], make_plan) -> dict[str, list[bytes]]:
    """The reference: sort every record by (key, record) in one list, cut it by the plan."""
    ordered = [r for _, r in sorted(transforms.key_records(records, "s"))]
    files: dict[str, list[bytes]] = {}
    for slot, ranges in make_plan(len(records)).files():
        files[slot.path] = [ordered[i] for begin, end in ranges for i in range(begin, end)]
    return files


def read(staging: str, path: str) -> list[bytes]:
    return [r.numpy() for r in tf.data.TFRecordDataset(layout.join(staging, path))]


def assert_matches_reference(records, staging, make_plan, bits, batch_size=10) -> None:
    expected = expected_files(records, make_plan)

    def check(entries):
        counts = {e["path"]: e["num_examples"] for e in entries}
        assert counts == {p: len(r) for p, r in expected.items()}, counts

    shard(records, staging, make_plan, bits, batch_size, check)
    for path, wanted in expected.items():
        assert read(staging, path) == wanted, path


def bucket_counts(records: list[bytes], bits: int) -> collections.Counter:
    return collections.Counter(
        transforms.bucket_of(k, bits) for k, _ in transforms.key_records(records, "s")
    )


RECORDS = [f"record-{i}".encode() for i in range(103)]


@pytest.mark.parametrize("bits", [0, 1, 3, 6])
def test_files_equal_one_global_sort_whatever_the_bucket_count(tmp_path, bits):
    assert_matches_reference(RECORDS, str(tmp_path), train_plan(4, per_file=9), bits)


def test_empty_buckets(tmp_path):
    records = RECORDS[:20]
    assert len(bucket_counts(records, 6)) < 64  # most of the 64 buckets hold nothing
    assert_matches_reference(records, str(tmp_path), train_plan(3), bits=6)


def test_skewed_buckets(tmp_path):
    # Nine in ten records in bucket 0 of 4, the rest spread.
    pool = [f"r{i}".encode() for i in range(2000)]
    buckets = {r: transforms.bucket_of(k, 2) for k, r in transforms.key_records(pool, "s")}
    records = [r for r in pool if buckets[r] == 0][:90] + [r for r in pool if buckets[r]][:10]
    assert bucket_counts(records, 2)[0] == 90
    assert_matches_reference(records, str(tmp_path), train_plan(4, per_file=7), bits=2)


def test_duplicates_at_bucket_edges_each_get_their_own_rank(tmp_path):
    # Copies of the first and last record of a bucket: their ranks straddle file cuts.
    keyed = sorted(transforms.key_records(RECORDS, "s"))
    by_bucket = collections.defaultdict(list)
    for key, record in keyed:
        by_bucket[transforms.bucket_of(key, 3)].append(record)
    edges = [by_bucket[b][0] for b in by_bucket] + [by_bucket[b][-1] for b in by_bucket]
    records = RECORDS + edges * 3
    assert_matches_reference(records, str(tmp_path), train_plan(4, per_file=5), bits=3)
    written = collections.Counter(
        r
        for path in expected_files(records, train_plan(4, per_file=5))
        for r in read(str(tmp_path), path)
    )
    assert written == collections.Counter(records)


def test_one_worker(tmp_path):
    assert_matches_reference(RECORDS, str(tmp_path), train_plan(1, validation=0.0), bits=3)


def test_more_workers_than_buckets_hold(tmp_path):
    # 4 buckets of about 25 records, 30 workers of 3: workers cut buckets and span them.
    assert_matches_reference(RECORDS, str(tmp_path), train_plan(30), bits=2)


def test_bundle_arrangement_does_not_change_bytes(tmp_path):
    shuffled = list(RECORDS)
    random.Random(1).shuffle(shuffled)
    shard(RECORDS, str(tmp_path / "a"), train_plan(4), bits=3, batch_size=7)
    shard(shuffled, str(tmp_path / "b"), train_plan(4), bits=2, batch_size=40)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.tfrecord"))
    assert len([f for f in files if transforms.BUCKETS_DIR not in str(f)]) == 5
    for rel in files:
        if transforms.BUCKETS_DIR not in str(rel):
            assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


def test_seed_changes_the_assignment():
    first = transforms.key_records(RECORDS, "s")
    second = transforms.key_records(RECORDS, "t")
    assert sorted(first)[0][1] != sorted(second)[0][1]


def test_bucket_bits_grow_with_the_data():
    assert transforms.bucket_bits(70_000, 800, 64 << 20, 16) == 4
    assert transforms.bucket_bits(7_000_000, 800, 64 << 20, 16) == 7  # 5.6 GB / 64 MiB -> 84
    assert transforms.bucket_bits(10, 800, 64 << 20, 1) == 0


def test_record_offsets_refuse_truncated_files(tmp_path):
    path = str(tmp_path / "f.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for r in (b"a", b"bb", b"ccc"):
            writer.write(r)
    data = tf.io.gfile.GFile(path, "rb").read()
    assert transforms.record_offsets(data) == [0, 17, 35, 54]
    with pytest.raises(ValueError, match="truncated"):
        transforms.record_offsets(data[:-3])
