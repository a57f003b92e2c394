"""The rank → file plan: validation, equal per-worker blocks, leftovers, files capped in size."""

from __future__ import annotations

import collections

import pytest

from contract import layout
from preprocess import plan


def test_counts_balance_and_leftover():
    p = plan.TrainPlan(103, num_workers=4, validation_fraction=0.1, max_records_per_file=1000)
    assert (p.num_validation, p.examples_per_worker, p.leftover_examples) == (10, 23, 1)
    slots = [p.slot(r) for r in range(103)]
    per_worker = collections.Counter(s.worker for s in slots if s.split == layout.TRAIN_SPLIT)
    assert per_worker == {0: 23, 1: 23, 2: 23, 3: 23}
    # The leftover rank is not lost: it lands in validation.
    assert sum(s.split == layout.VALIDATION_SPLIT for s in slots) == 11
    assert slots[-1].split == layout.VALIDATION_SPLIT


def test_files_are_capped_and_named_by_layout():
    p = plan.TrainPlan(100, num_workers=2, validation_fraction=0.0, max_records_per_file=20)
    assert p.files_per_worker == 3
    paths = collections.Counter(p.slot(r).path for r in range(100))
    assert paths[layout.worker_file_name(1, 2, 2, 3)] == 10
    assert paths[layout.worker_file_name(0, 2, 0, 3)] == 20
    assert max(paths.values()) <= 20


def test_whole_split_plan():
    p = plan.WholeSplitPlan(45, split=layout.EVAL_SPLIT, max_records_per_file=20)
    paths = collections.Counter(p.slot(r).path for r in range(45))
    assert paths == {
        layout.whole_split_file_name("eval", 0, 3): 20,
        layout.whole_split_file_name("eval", 1, 3): 20,
        layout.whole_split_file_name("eval", 2, 3): 5,
    }
    with pytest.raises(ValueError, match="rank 45 outside"):
        p.slot(45)


@pytest.mark.parametrize(
    "make",
    [
        lambda: plan.TrainPlan(103, num_workers=4, validation_fraction=0.1, max_records_per_file=7),
        lambda: plan.TrainPlan(50, num_workers=1, validation_fraction=0.0, max_records_per_file=50),
        lambda: plan.TrainPlan(61, num_workers=6, validation_fraction=0.3, max_records_per_file=4),
        lambda: plan.WholeSplitPlan(45, split=layout.EVAL_SPLIT, max_records_per_file=20),
    ],
)
def test_file_ranges_hold_exactly_the_ranks_slot_assigns(make):
    p = make()
    by_slot = collections.defaultdict(list)
    for rank in range(p.num_examples):
        by_slot[p.slot(rank).path].append(rank)
    files = p.files()
    assert len({slot.path for slot, _ in files}) == len(files)
    for slot, ranges in files:
        ranks = [r for begin, end in ranges for r in range(begin, end)]
        assert ranks == by_slot.pop(slot.path, []), slot.path
    assert not by_slot


def test_records_per_file_is_cut_by_bytes_then_by_count():
    assert plan.records_per_file(800, 128 << 20, 100_000) == 100_000
    assert plan.records_per_file(800, 80_000, 100_000) == 100
    assert plan.records_per_file(800, 100, 100_000) == 1
