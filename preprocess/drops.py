"""Daily drops: TFRecord files in dated folders, read as a rolling window of days.

    drops:drops/{YYYY}-{MM}-{DD}/*.tfrecord
    drops:train=drops/{YYYY}-{MM}-{DD}/*.tfrecord,test=drops/test/*.tfrecord

A pattern with the placeholders {YYYY}, {MM} and {DD} is dated: the window reads it for each of
the last `window_days` days up to and including the run's date. A pattern without them (the
`test=` one above) names fixed files read every night, which keeps the evaluation set the same
from night to night. The records are tf.train.Example with the image and label features, as for
`tfrecord:` datasets (`preprocess.tfrecord_source`).

An earlier day without files is left out with a warning and listed in the manifest; the run's
own day without files is an error, so old data is never trained on as if it were new. The
manifest's `drops` section names every day and file (with its sha256) that went in.

A drop may say what it holds: a `SHA256SUMS` file beside its files (`sha256sum`'s format,
`<hex>  <name>` a line, as `preprocess.make_drops` writes it). Then every file of the folder the
run would read must be listed with its sha256, and every listed file must be there, or the run
stops in one line before the job starts: a drop cut short, even between two records (which
still reads as valid TFRecord), or still being copied is never trained on.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import logging
import posixpath
import re
from typing import Any

import tensorflow as tf

from contract import atomic
from contract.messages import notice_line
from preprocess import tfrecord_source
from preprocess.config import PreprocessConfig
from preprocess.errors import BadInputError
from preprocess.make_drops import SUMS_FILE

ADAPTER = "drops"
PLACEHOLDERS = ("{YYYY}", "{MM}", "{DD}")
DEFAULT_WINDOW_DAYS = 1
HASH_THREADS = 8
_PLACEHOLDER = re.compile(r"\{[A-Za-z]*\}")
_SUM_LINE = re.compile(r"(?P<sum>[0-9a-fA-F]{64}) [ *](?P<name>[^/]+)")
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Window:
    """The files a run reads: by split, each file with the day it is from (None: undated)."""

    patterns: dict[str, list[str]]  # split -> its patterns as given
    days: list[str]  # the window's days, oldest first (YYYY-MM-DD)
    missing_days: list[str]  # days of the window without files, oldest first
    files: dict[str, list[tuple[str, str | None]]]  # split -> [(file, day or None)], in order

    def file_lists(self) -> dict[str, list[str]]:
        """Every split's files, in reading order (for `tfrecord_source.open_files`)."""
        return {split: [path for path, _ in files] for split, files in self.files.items()}


# The longest window: ten years of days. Longer is a typo, and reaches before the calendar.
MAX_WINDOW_DAYS = 3653


def window_days(cfg: PreprocessConfig) -> int:
    """The window's length: `cfg.window_days`, or one day (the run's own) when unset."""
    return DEFAULT_WINDOW_DAYS if cfg.window_days is None else cfg.window_days


def check_config(cfg: PreprocessConfig, adapter: str) -> None:
    """Refuses a window the dataset cannot honour, before anything is read or written.

    Raises:
        BadInputError: a window of less than one day, or a window asked of a dataset that is
            not dated.
    """
    if cfg.window_days is not None and cfg.window_days < 1:
        raise BadInputError(
            f"window_days must be at least 1 (the run's own day), got {cfg.window_days}"
        )
    if cfg.window_days is not None and cfg.window_days > MAX_WINDOW_DAYS:
        raise BadInputError(
            f"window_days must be at most {MAX_WINDOW_DAYS} (ten years of daily drops), got "
            f"{cfg.window_days}"
        )
    if cfg.window_days is not None and adapter != ADAPTER:
        raise BadInputError(
            f"window_days {cfg.window_days} needs a dated dataset, and --dataset {cfg.dataset} "
            "has no date placeholder: name daily drops as "
            "drops:PATH/{YYYY}-{MM}-{DD}/*.tfrecord, or leave window_days unset"
        )


def _check_placeholders(pattern: str) -> bool:
    """Whether `pattern` is dated (has every placeholder).

    Raises:
        BadInputError: an unknown placeholder, or only some of the three.
    """
    found = set(_PLACEHOLDER.findall(pattern))
    unknown = sorted(found - set(PLACEHOLDERS))
    if unknown:
        raise BadInputError(
            f"drops: pattern {pattern} has an unknown placeholder {unknown[0]}: "
            f"use {', '.join(PLACEHOLDERS)}"
        )
    if found and len(found) != len(PLACEHOLDERS):
        missing = [p for p in PLACEHOLDERS if p not in found]
        raise BadInputError(
            f"drops: pattern {pattern} lacks {', '.join(missing)}: a dated pattern names the "
            "whole day, e.g. drops/{YYYY}-{MM}-{DD}/*.tfrecord"
        )
    return bool(found)


def dated(pattern: str, day: datetime.date) -> str:
    """The pattern of one day: its placeholders filled in."""
    return (
        pattern.replace("{YYYY}", f"{day.year:04d}")
        .replace("{MM}", f"{day.month:02d}")
        .replace("{DD}", f"{day.day:02d}")
    )


def select_window(target: str, cfg: PreprocessConfig) -> Window:
    """The files of the window that ends on the run's date.

    Args:
        target: what follows 'drops:' in `--dataset`.
        cfg: the stage's parameters (date, window_days).

    Raises:
        BadInputError: no pattern is dated, a pattern is malformed, the run's own day has no
            files, or an undated pattern matches nothing.
    """
    patterns = tfrecord_source.parse_patterns(target)
    is_dated = {p: _check_placeholders(p) for ps in patterns.values() for p in ps}
    if not any(is_dated.values()):
        raise BadInputError(
            f"drops: pattern {next(iter(is_dated))} has no date placeholder: name the day's "
            f"folder or file with {', '.join(PLACEHOLDERS)} "
            "(e.g. drops:drops/{YYYY}-{MM}-{DD}/*.tfrecord)"
        )
    run_day = datetime.date.fromisoformat(cfg.date)
    length = window_days(cfg)
    days = [run_day - datetime.timedelta(days=back) for back in range(length - 1, -1, -1)]
    files: dict[str, list[tuple[str, str | None]]] = {}
    missing: set[str] = set()
    for split, split_patterns in patterns.items():
        found: dict[str, str | None] = {}
        for pattern in split_patterns:
            if not is_dated[pattern]:
                matched = tfrecord_source.list_files({split: [pattern]})[split]
                found.update({path: None for path in matched if path not in found})
                continue
            for day in days:
                matched = [
                    path
                    for path in sorted(tf.io.gfile.glob(dated(pattern, day)))
                    if posixpath.basename(path) != SUMS_FILE  # what a drop says it holds
                ]
                if not matched and day == run_day:
                    raise BadInputError(
                        f"no drop for the run's date {cfg.date}: nothing matches "
                        f"{dated(pattern, day)} (split '{split}'); older drops are never "
                        "reused in its place: deliver the day's files or run another date"
                    )
                if not matched:
                    missing.add(day.isoformat())
                found.update({path: day.isoformat() for path in matched if path not in found})
        files[split] = sorted(found.items(), key=lambda item: (item[1] or "", item[0]))
    missing_days = sorted(missing)
    if missing_days:
        message = (
            f"drops: no files for {', '.join(missing_days)} in the {length}-day window ending "
            f"{cfg.date}; training on the {length - len(missing_days)} days there are"
        )
        log.warning(message)
        print(notice_line(message), flush=True)
    return Window(
        patterns=patterns,
        days=[d.isoformat() for d in days],
        missing_days=missing_days,
        files=files,
    )


def check_files(window: Window, fmt: tfrecord_source.ExampleFormat, resize: bool) -> None:
    """Checks the first record of every file: readable, both features of one kind, and (unless
    images are resized) images of one shape, so a bad drop is named before the job starts.

    Raises:
        BadInputError: naming the file.
    """
    reference: tuple[str, str, list[int]] | None = None  # (file, label kind, image shape)
    for path in (p for split in sorted(window.files) for p, _ in window.files[split]):
        try:
            kind, shape = tfrecord_source.describe_first_record(path, fmt)
        except BadInputError as e:
            if fmt.raw_image_shape is None and str(e).startswith("cannot decode"):
                raise BadInputError(
                    f"{e}; if the drops hold raw uint8 pixels (as preprocess.make_drops writes "
                    "them), pass --raw_image_shape HxWxC (28x28x1 for Fashion-MNIST)"
                ) from None
            raise
        if kind is None:
            continue  # an empty file adds nothing
        if reference is None:
            reference = (path, kind, shape)
            continue
        first, first_kind, first_shape = reference
        if kind != first_kind:
            raise BadInputError(
                f"drop file {path}: label feature '{fmt.label_feature}' is {kind}, in {first} "
                f"it is {first_kind}: every drop needs the same feature types"
            )
        if not resize and shape != first_shape:
            raise BadInputError(
                f"drop file {path} holds images of shape {'x'.join(map(str, shape))}, "
                f"{first} of {'x'.join(map(str, first_shape))}: every drop needs one image "
                "shape (or pass --resize HxW)"
            )


def _read_sums(path: str) -> dict[str, str]:
    """A SHA256SUMS file's names and sums (`<hex>  <name>` or `<hex> *<name>` a line).

    Raises:
        BadInputError: a line that is not a sum and a name.
    """
    sums = {}
    with tf.io.gfile.GFile(path, "r") as f:
        for number, line in enumerate(f.read().splitlines(), 1):
            if not line.strip():
                continue
            match = _SUM_LINE.fullmatch(line.strip())
            if match is None:
                raise BadInputError(
                    f"{path} line {number} is not '<sha256>  <file name>': {line[:80]!r}"
                )
            sums[match.group("name")] = match.group("sum").lower()
    return sums


def check_sums(window: Window) -> dict[str, str]:
    """Checks the files of every folder that holds a SUMS_FILE against it.

    Returns:
        The sha256 of every file checked, by path (`describe` takes them instead of hashing
        those files again).

    Raises:
        BadInputError: a file of the window the folder's sums do not list, one whose sha256
            differs (cut short, changed), or a listed file that is missing.
    """
    by_folder: dict[str, list[str]] = {}
    for path in (p for files in window.files.values() for p, _ in files):
        by_folder.setdefault(posixpath.dirname(path), []).append(path)
    checked: dict[str, str] = {}
    for folder, paths in sorted(by_folder.items()):
        sums_path = posixpath.join(folder, SUMS_FILE)
        if not tf.io.gfile.exists(sums_path):
            continue
        listed = _read_sums(sums_path)
        for path in paths:
            name = posixpath.basename(path)
            if name not in listed:
                raise BadInputError(
                    f"drop file {path} is not listed in {sums_path}: a drop's files are the ones "
                    "its sums name; deliver the drop again"
                )
        with concurrent.futures.ThreadPoolExecutor(HASH_THREADS) as pool:
            found = dict(zip(paths, pool.map(atomic.sha256_file, paths), strict=True))
        for path, sha256 in found.items():
            if sha256 != listed[posixpath.basename(path)]:
                raise BadInputError(
                    f"drop file {path} fails its sha256 in {sums_path} ({sha256[:16]}… is not "
                    f"{listed[posixpath.basename(path)][:16]}…): the drop was cut short or "
                    "changed after it was written; deliver the drop again"
                )
        absent = sorted(
            name for name in listed if not tf.io.gfile.exists(posixpath.join(folder, name))
        )
        if absent:
            raise BadInputError(
                f"{sums_path} lists {', '.join(absent)}, not in {folder}: the drop is "
                "incomplete (still being copied?); deliver the rest or run another date"
            )
        checked.update(found)
    return checked


def describe(
    window: Window, counts: dict[str, int], length: int, hashed: dict[str, str] | None = None
) -> dict[str, Any]:
    """The manifest's `drops` section: the window, and every file read with its sha256.

    Args:
        window: the selected files.
        counts: records per file.
        length: the window's length in days.
        hashed: sha256s already taken, by path (`check_sums`'); the other files are hashed.
    """
    paths = [p for split in sorted(window.files) for p, _ in window.files[split]]
    sums = dict(hashed or {})
    todo = [path for path in paths if path not in sums]
    with concurrent.futures.ThreadPoolExecutor(HASH_THREADS) as pool:
        sums.update(zip(todo, pool.map(atomic.sha256_file, todo), strict=True))
    sizes = {path: tf.io.gfile.stat(path).length for path in paths}
    read = sorted({day for files in window.files.values() for _, day in files if day})
    return {
        "patterns": window.patterns,
        "window_days": length,
        "days": window.days,
        "days_read": read,
        "missing_days": window.missing_days,
        "files": [
            {
                "path": path,
                "split": split,
                "date": day,
                "num_examples": counts[path],
                "sha256": sums[path],
                "size_bytes": sizes[path],
            }
            for split in sorted(window.files)
            for path, day in window.files[split]
        ],
    }
