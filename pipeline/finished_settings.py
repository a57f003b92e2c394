"""A finished stage counts as done only for the settings it was made with.

luigi calls a task done when its output exists; a date whose shard set was made with other
Preprocess parameters, or whose training finished with other Train settings, than the ones
asked for would then count as done and feed a model those settings did not make. These checks
refuse such a date before anything is scheduled, naming each differing setting and the ways
out.
"""

from __future__ import annotations

import os
import sys

from contract import atomic, gfile, layout, settings
from contract.messages import error_line
from pipeline.params import RunTask
from train.config import SHAPING_SETTINGS

# Preprocess parameters that decide what the shard set holds; data_dir and friends only say
# where the sources come from, and max_records_per_file only how many files hold them.
SHARD_SET_PARAMETERS = (
    "dataset",
    "num_workers",
    "validation_fraction",
    "seed",
    "train_split",
    "eval_split",
    "eval_fraction",
    "window_days",
    "resize",
    "image_feature",
    "label_feature",
    "raw_image_shape",
)


class ShardSetMismatch(RuntimeError):
    """The date's shard set exists but was made with other Preprocess parameters."""


class TrainSettingsMismatch(RuntimeError):
    """The date's training finished, but with other Train parameters than this run's."""


def printed(refusal: Exception) -> Exception:
    """`refusal`, its message printed first as the stages' one error line (luigi's own
    report of it is dropped by full_run.RefusalTraceback)."""
    print(error_line(str(refusal)), file=sys.stderr, flush=True)
    return refusal


def check_shard_set_parameters(preprocess: RunTask) -> None:
    """Refuses a date whose existing shard set was made with other Preprocess parameters.

    Raises:
        ShardSetMismatch: naming each differing parameter, both values, and the ways out.
    """
    path = preprocess.output().path
    if not gfile.exists(path):
        return
    doc = atomic.read_json(path)
    recorded = {**doc.get("parameters", {}), "num_workers": doc.get("num_workers")}
    if "eval_held_out" not in doc.get("dataset", {}):
        recorded.pop("eval_fraction", None)  # only says anything when the eval split was cut
    differing = [
        f"{name} {recorded[name]!r} (now {getattr(preprocess, name)!r})"
        for name in SHARD_SET_PARAMETERS
        if name in recorded and not _same(recorded[name], getattr(preprocess, name))
    ]
    if differing:
        message = (
            f"the shard set {os.path.dirname(path)} was made with other Preprocess "
            f"parameters: {', '.join(differing)}. Run with the parameters it was made with, "
            "or rebuild it with --force-stage preprocess (the old one moves to superseded/)"
        )
        raise printed(ShardSetMismatch(message))


def check_train_settings(train: RunTask) -> None:
    """Refuses a date whose training finished with other Train parameters than `train`'s:
    luigi would count it as done and evaluate a model these parameters did not make.

    Raises:
        TrainSettingsMismatch: naming each differing parameter, both values, and the ways out.
    """
    if not gfile.exists(train.output().path):
        return
    path = layout.join(
        layout.train_dir(train.output_root, train.date_str), layout.TRAIN_CONFIG_FILE
    )
    if not gfile.exists(path):
        return  # trained by a version that did not record its settings
    recorded = atomic.read_json(path)
    # What shapes training, as train.config declares it; how often to log or save, or how long
    # to wait, makes the same model.
    compared = sorted(
        name for name in train.param_kwargs if name in SHAPING_SETTINGS and name in recorded
    )
    differing = [
        f"{name} {recorded[name]!r} (now {settings.plain(getattr(train, name))!r})"
        for name in compared
        if not _same(recorded[name], settings.plain(getattr(train, name)))
        # "auto" stands for whichever policy the machine that trained chose
        and not (name == "precision" and getattr(train, name) == "auto")
    ]
    if differing:
        message = (
            f"{train.date_str} is complete with other Train settings: {', '.join(differing)} "
            f"(recorded in {path}). Run with the settings it was trained with, or retrain "
            "with --force-stage train (the old run moves to superseded/)"
        )
        raise printed(TrainSettingsMismatch(message))


def _same(recorded: object, wanted: object) -> bool:
    if isinstance(recorded, dict) and isinstance(wanted, dict):
        return recorded == wanted  # hparams: key order does not matter
    if isinstance(recorded, (int, float)) and isinstance(wanted, (int, float)):
        return float(recorded) == float(wanted)
    return str(recorded) == str(wanted)
