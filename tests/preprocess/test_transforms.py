"""ShardSplits on in-memory records against a plain sort: exact files whatever the bucketing."""

from __future__ import annotations

import collections
import functools
import pathlib
import random

import apache_beam as beam
import pytest
import tensorflow as tf
from apache_beam.runners.portability.fn_api_runner import fn_runner
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that

from contract import layout
from preprocess import plan, reading, transforms


def train_plan(num_workers: int, per_file: int = 1000, validation: float = 0.1):
    return functools.partial(
        plan.TrainPlan,
        num_workers=num_workers,
        validation_fraction=validation,
        max_records_per_file=per_file,
    )


class ListReader:
    """Reads chunks of an in-memory list of records, in batches (the TFDS reader's interface)."""

    def __init__(self, records: list[bytes], batch_size: int):
        self._records = records
        self._batch_size = batch_size

    def setup(self) -> None:
        pass

    def read(self, chunk):
        _, start, end = chunk
        for i in range(start, end, self._batch_size):
            yield self._records[i : min(i + self._batch_size, end)]


def shard(
    records: list[bytes],
    staging: str,
    make_plan,
    bits: int,
    batch_size: int = 10,
    check=None,
    chunk_size: int = 30,
) -> None:
    chunks = reading.read_chunks("train", len(records), chunk_size)
    with test_pipeline.TestPipeline(runner=fn_runner.FnApiRunner()) as p:
        source = p | "Chunks" >> beam.Create(chunks, reshuffle=False)
        entries = {"train": source} | "Shard" >> transforms.ShardSplits(
            {"train": (make_plan, bits)},
            seed="s",
            staging_dir=staging,
            reader=ListReader(records, batch_size),
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
    shard(RECORDS, str(tmp_path / "a"), train_plan(4), bits=3, batch_size=7, chunk_size=20)
    shard(shuffled, str(tmp_path / "b"), train_plan(4), bits=2, batch_size=40, chunk_size=103)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.tfrecord"))
    assert len([f for f in files if transforms.BUCKETS_DIR not in str(f)]) == 5
    for rel in files:
        if transforms.BUCKETS_DIR not in str(rel):
            assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


def test_records_reach_the_shuffle_only_as_fragment_paths_which_are_then_removed(tmp_path):
    # Every chunk's records of a bucket are in one fragment file; what a read step emits is
    # its path and count, and sorting the bucket removes its fragments.
    staging = str(tmp_path)
    spill = transforms.SpillFragments(ListReader(RECORDS, 7), "train", "s", 2, staging)
    spill.setup()
    emitted = [e for chunk in reading.read_chunks("train", 103, 40) for e in spill.process(chunk)]
    assert all(isinstance(path, str) and isinstance(n, int) for _, (path, n) in emitted)
    assert len(emitted) == len({path for _, (path, _) in emitted}) <= 3 * 4  # chunks x buckets
    for (role, bucket), (path, count) in emitted:
        keys = [r[: transforms.KEY_BYTES] for r in transforms.read_records(path)]
        assert role == "train" and len(keys) == count
        assert {transforms.bucket_of(k, 2) for k in keys} == {bucket}
    assert sum(n for _, (_, n) in emitted) == 103
    groups = collections.defaultdict(list)
    for bucket_id, ref in emitted:
        groups[bucket_id].append(ref)
    sort = transforms.SortBucket(staging)
    sizes = [s for group in sorted(groups.items()) for s in sort.process(group)]
    assert sum(s["count"] for s in sizes) == 103
    assert not list((tmp_path / transforms.FRAGMENTS_DIR).rglob("*.tfrecord"))


def test_a_retried_read_or_sort_gives_the_same_files_once(tmp_path):
    staging = str(tmp_path)
    spill = transforms.SpillFragments(ListReader(RECORDS, 10), "train", "s", 1, staging)
    spill.setup()
    chunk = ("train", 0, 50)
    first = list(spill.process(chunk))
    before = {p: pathlib.Path(p).read_bytes() for _, (p, _) in first}
    assert list(spill.process(chunk)) == first  # the retry overwrites the same files
    on_disk = sorted(str(p) for p in (tmp_path / transforms.FRAGMENTS_DIR).rglob("*"))
    assert [p for p in on_disk if p.endswith(".tfrecord")] == sorted(before)
    assert {p: pathlib.Path(p).read_bytes() for p in before} == before
    sort = transforms.SortBucket(staging)
    (bucket_id, ref) = first[0]
    done = list(sort.process((bucket_id, [ref, ref])))  # a repeated element: one fragment
    assert done[0]["count"] == ref[1]
    sorted_bytes = pathlib.Path(done[0]["path"]).read_bytes()
    # A retry after the fragments were removed keeps the bucket file it wrote.
    assert list(sort.process((bucket_id, [ref]))) == done
    assert pathlib.Path(done[0]["path"]).read_bytes() == sorted_bytes


def test_a_fragment_with_another_count_is_refused(tmp_path):
    spill = transforms.SpillFragments(ListReader(RECORDS, 10), "train", "s", 0, str(tmp_path))
    spill.setup()
    [(bucket_id, (path, count))] = spill.process(("train", 0, 20))
    with pytest.raises(ValueError, match=r"holds 20 records, not 21"):
        list(transforms.SortBucket(str(tmp_path)).process((bucket_id, [(path, count + 1)])))


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
