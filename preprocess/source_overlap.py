"""Refusing a source file that feeds both the training data and the eval split, before any work.

A file is the same file by its path or by its bytes (sha256): the eval split read from it would
score the model on examples it trained on. It counts only where the records read for training
and those read for eval overlap, so one file cut by split syntax (`train[:50%]`,
`train[50%:]`) into disjoint halves is allowed. Only files whose size occurs on both sides are
hashed, and daily drops' sums (already taken for the manifest) are reused.

This applies to the user's files (image folders, TFRecord patterns, daily drops). A TFDS
dataset has none: the Beam job's count of eval images also in the training data guards it
(`eval_overlap`).
"""

from __future__ import annotations

import collections
import concurrent.futures

import tensorflow as tf

from contract import atomic
from preprocess.errors import BadInputError
from preprocess.reading import SplitRange

HASH_THREADS = 16
Files = dict[str, list[tuple[str, int]]]  # own split -> [(file, examples)], in reading order
Spans = dict[str, list[tuple[int, int]]]  # file -> record ranges read from it


def spans_read(files: Files, ranges: list[SplitRange]) -> Spans:
    """The record ranges read from each file for ranges of the dataset's own splits."""
    spans: Spans = collections.defaultdict(list)
    for split, start, end in ranges:
        offset = 0
        for path, count in files.get(split, []):
            begin, finish = max(start, offset), min(end, offset + count)
            if begin < finish:
                spans[path].append((begin - offset, finish - offset))
            offset += count
    return spans


def _overlap(first: list[tuple[int, int]], second: list[tuple[int, int]]) -> bool:
    return any(max(a, c) < min(b, d) for a, b in first for c, d in second)


def _sums(paths: set[str], known: dict[str, str]) -> dict[str, str]:
    """sha256 of each path's bytes, from `known` or read, in parallel."""
    missing = sorted(paths - known.keys())
    with concurrent.futures.ThreadPoolExecutor(HASH_THREADS) as pool:
        read = dict(zip(missing, pool.map(atomic.sha256_file, missing), strict=True))
    return {path: known.get(path) or read[path] for path in paths}


def _sizes(paths: set[str]) -> dict[str, int]:
    ordered = sorted(paths)
    with concurrent.futures.ThreadPoolExecutor(HASH_THREADS) as pool:
        lengths = pool.map(lambda p: tf.io.gfile.stat(p).length, ordered)
        return dict(zip(ordered, lengths, strict=True))


def check_disjoint(
    files: Files,
    training: list[SplitRange],
    evaluation: list[SplitRange],
    splits: tuple[str, str],
    known_sums: dict[str, str] | None = None,
) -> None:
    """Refuses a file read for both the training data and the eval split.

    Args:
        files: each own split's files with their number of examples.
        training: the ranges of own splits the train role reads (train and validation).
        evaluation: those the eval role reads.
        splits: the two split expressions as given (`--train_split`, `--eval_split`).
        known_sums: sha256 of files already hashed (daily drops'), by path.

    Raises:
        BadInputError: one line naming the file (or both files) and both splits.
    """
    train_spans, eval_spans = spans_read(files, training), spans_read(files, evaluation)
    train_split, eval_split = splits
    for path in sorted(train_spans.keys() & eval_spans.keys()):
        if _overlap(train_spans[path], eval_spans[path]):
            raise BadInputError(
                f"source file {path} is read for both the training data (split "
                f"'{train_split}') and the eval split ('{eval_split}'): the model would be "
                "scored on examples it trained on; give the two splits disjoint files"
            )
    sizes = _sizes(train_spans.keys() | eval_spans.keys())
    both = {sizes[p] for p in train_spans} & {sizes[p] for p in eval_spans}
    candidates = {p for p in sizes if sizes[p] in both}
    sums = _sums(candidates, known_sums or {})
    by_sum: dict[str, list[str]] = collections.defaultdict(list)
    for path in sorted(p for p in candidates if p in train_spans):
        by_sum[sums[path]].append(path)
    for path in sorted(p for p in candidates if p in eval_spans):
        for twin in by_sum.get(sums[path], []):
            # The same bytes hold the same records in the same order.
            if twin != path and _overlap(train_spans[twin], eval_spans[path]):
                raise BadInputError(
                    f"source files {twin} (training data, split '{train_split}') and {path} "
                    f"(eval split '{eval_split}') hold the same bytes (sha256 "
                    f"{sums[path][:16]}...): the model would be scored on examples it trained "
                    "on; remove one of them"
                )
