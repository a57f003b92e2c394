"""Which file every example goes to, decided by its rank among all examples' keys.

A rank is an example's position in the sorted list of the split's keys (sha256 of seed and
record), so the assignment depends only on the data and the parameters, never on the order
in which a runner happens to deliver elements.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from contract import layout

Ranges = tuple[tuple[int, int], ...]  # half-open rank ranges, in file order


def records_per_file(record_bytes: int, max_bytes_per_file: int, max_records_per_file: int) -> int:
    """How many records a file holds: as many as fit `max_bytes_per_file`, capped by count."""
    return max(1, min(max_records_per_file, max_bytes_per_file // max(1, record_bytes)))


@dataclasses.dataclass(frozen=True)
class FileSlot:
    """One output file: its path relative to the data folder, split and worker."""

    path: str
    split: str
    worker: int | None


def num_validation_examples(num_examples: int, validation_fraction: float) -> int:
    """How many of the training split's examples are held out for validation."""
    return int(round(num_examples * validation_fraction))


def num_held_out_eval_examples(num_examples: int, eval_fraction: float) -> int:
    """How many of the training split's examples are held out for evaluation (when the
    dataset has no eval split of its own)."""
    return int(round(num_examples * eval_fraction))


@dataclasses.dataclass(frozen=True)
class TrainPlan:
    """Cuts the dataset's training split into a held-out eval part (only when `eval_fraction`
    is set), validation, and equal per-worker parts.

    Ranks [0, num_eval) are eval; the next num_validation ranks are validation; the next
    examples_per_worker * num_workers ranks are train, in one contiguous block per worker; the
    leftover ranks (fewer than num_workers) also go to validation so no example is lost, and
    are counted as `leftover_examples`. Validation is `validation_fraction` of what eval leaves.
    """

    num_examples: int
    num_workers: int
    validation_fraction: float
    max_records_per_file: int
    eval_fraction: float = 0.0

    @functools.cached_property
    def num_eval(self) -> int:
        return num_held_out_eval_examples(self.num_examples, self.eval_fraction)

    @functools.cached_property
    def num_validation(self) -> int:
        return num_validation_examples(self.num_examples - self.num_eval, self.validation_fraction)

    @functools.cached_property
    def examples_per_worker(self) -> int:
        return (self.num_examples - self.num_eval - self.num_validation) // self.num_workers

    @functools.cached_property
    def num_train(self) -> int:
        return self.examples_per_worker * self.num_workers

    @functools.cached_property
    def leftover_examples(self) -> int:
        return self.num_examples - self.num_eval - self.num_validation - self.num_train

    @functools.cached_property
    def files_per_worker(self) -> int:
        return max(1, math.ceil(self.examples_per_worker / self.max_records_per_file))

    @functools.cached_property
    def validation_files(self) -> int:
        total = self.num_validation + self.leftover_examples
        return max(1, math.ceil(total / self.max_records_per_file))

    @functools.cached_property
    def eval_files(self) -> int:
        return math.ceil(self.num_eval / self.max_records_per_file)

    def slot(self, rank: int) -> FileSlot:
        """The file of the example with this rank."""
        if not 0 <= rank < self.num_examples:
            raise ValueError(f"rank {rank} outside [0, {self.num_examples})")
        if rank < self.num_eval:
            return self._eval_slot(rank // self.max_records_per_file)
        rank -= self.num_eval
        train_rank = rank - self.num_validation
        if 0 <= train_rank < self.num_train:
            worker, index = divmod(train_rank, self.examples_per_worker)
            return self._train_slot(worker, index // self.max_records_per_file)
        # Validation first, then the leftover train ranks, as one sequence.
        index = rank if train_rank < 0 else rank - self.num_train
        return self._validation_slot(index // self.max_records_per_file)

    def files(self) -> list[tuple[FileSlot, Ranges]]:
        """Every file of the plan with the rank ranges it holds, in order."""
        out: list[tuple[FileSlot, Ranges]] = []
        for index in range(self.eval_files):
            start = index * self.max_records_per_file
            end = min(start + self.max_records_per_file, self.num_eval)
            out.append((self._eval_slot(index), ((start, end),)))
        shift = self.num_eval
        for worker in range(self.num_workers):
            begin = shift + self.num_validation + worker * self.examples_per_worker
            for index in range(self.files_per_worker):
                start = begin + index * self.max_records_per_file
                end = min(start + self.max_records_per_file, begin + self.examples_per_worker)
                if start < end or index == 0:
                    out.append((self._train_slot(worker, index), ((start, end),)))
        # Validation: held-out ranks [0, num_validation), then the leftover train ranks.
        held_out = self.num_validation
        total = held_out + self.leftover_examples
        for index in range(self.validation_files):
            start = index * self.max_records_per_file
            end = min(start + self.max_records_per_file, total)
            ranges = []
            if start < held_out:
                ranges.append((shift + start, shift + min(end, held_out)))
            if end > held_out:
                skip = shift + self.num_train
                ranges.append((max(start, held_out) + skip, end + skip))
            out.append((self._validation_slot(index), tuple(r for r in ranges if r[0] < r[1])))
        return out

    @functools.lru_cache(maxsize=4096)  # noqa: B019  (plans are few and small)
    def _train_slot(self, worker: int, file_index: int) -> FileSlot:
        path = layout.worker_file_name(worker, self.num_workers, file_index, self.files_per_worker)
        return FileSlot(path, layout.TRAIN_SPLIT, worker)

    @functools.lru_cache(maxsize=4096)  # noqa: B019
    def _validation_slot(self, file_index: int) -> FileSlot:
        path = layout.whole_split_file_name(
            layout.VALIDATION_SPLIT, file_index, self.validation_files
        )
        return FileSlot(path, layout.VALIDATION_SPLIT, None)

    @functools.lru_cache(maxsize=4096)  # noqa: B019
    def _eval_slot(self, file_index: int) -> FileSlot:
        path = layout.whole_split_file_name(layout.EVAL_SPLIT, file_index, self.eval_files)
        return FileSlot(path, layout.EVAL_SPLIT, None)


@dataclasses.dataclass(frozen=True)
class WholeSplitPlan:
    """Writes a split whole (the eval split), in rank order, capped per file."""

    num_examples: int
    split: str
    max_records_per_file: int

    @functools.cached_property
    def num_files(self) -> int:
        return max(1, math.ceil(self.num_examples / self.max_records_per_file))

    def slot(self, rank: int) -> FileSlot:
        """The file of the example with this rank."""
        if not 0 <= rank < self.num_examples:
            raise ValueError(f"rank {rank} outside [0, {self.num_examples})")
        file_index = rank // self.max_records_per_file
        path = layout.whole_split_file_name(self.split, file_index, self.num_files)
        return FileSlot(path, self.split, None)

    def files(self) -> list[tuple[FileSlot, Ranges]]:
        """Every file of the plan with the rank range it holds, in order."""
        out: list[tuple[FileSlot, Ranges]] = []
        for index in range(self.num_files):
            start = index * self.max_records_per_file
            end = min(start + self.max_records_per_file, self.num_examples)
            path = layout.whole_split_file_name(self.split, index, self.num_files)
            out.append((FileSlot(path, self.split, None), ((start, end),) if start < end else ()))
        return out
