"""Warm start: a run begins from the last blessed model's weights instead of fresh ones.

`warm_start=last-blessed` is settled once, before any worker starts (`settle`, called by the
launcher): the latest pointer of the run's output root (`<root>/latest.json`; the root and
date as the Train task gives them, or the run a train folder `<root>/<date>/train` lies in)
names a model file and its sha256. The settled config names that file, its sha256 and its
run's date (`warm_start_from`, `warm_start_sha256`, `warm_start_date`), or says why the run
starts cold (`cold_start_reason`). Every worker gets the same settled config, and its
warm-start fields are part of the backup's fingerprint, so a resumed run starts from the same
model even if the pointer has moved since (`settle` takes a backup's own settling). A worker
loads the weights only on a fresh start (`load_into`); on resume the backup's weights win.

The starting model is the last blessed one *before* the run's date: the pointer's when it
names an earlier night, else the newest blessed, not rolled-back night before the run's date
in the run history (contract.history). A date retrained with `--force-stage` never starts
from its own earlier model, nor a backfill from a later night's.

The run starts cold, and says why, when there is no such model (the first night), the pointer
is unreadable, the model is missing, fails its sha256 or cannot be loaded, its weights differ
in names or shapes from the model this run builds (another architecture, input shape or number
of classes), the pointer's dataset identity is not this shard set's (another lineage: a model
of other classes with the same shapes), or the pointer names this run's own model.

TensorFlow loads only to look at a model or a backup: a launch whose run starts cold for want
of a pointer or a file settles without it.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
from typing import TYPE_CHECKING, Any

from contract import (
    atomic,
    dates,
    gfile,
    history,
    layout,
    lineage,
    model_code,
    pointer,
)
from train.checks import has_backup_folder, is_settled
from train.config import WARM_START_SETTLED, ConfigError, TrainConfig

if TYPE_CHECKING:
    import tf_keras as keras

log = logging.getLogger("train")

# The fields `settle` fills in; the rest of the config is the user's.
SETTLED_FIELDS = WARM_START_SETTLED
WeightsSignature = list[tuple[str, tuple[int, ...]]]


def settle(config: TrainConfig, shard_manifest: dict[str, Any]) -> TrainConfig:
    """`config` with `warm_start=last-blessed` settled to a model file and its sha256, or to a
    cold start with its reason; unchanged when warm start is off or already settled.

    A train folder with a backup keeps the starting model its backup was made with.
    """
    if is_settled(config):
        return config
    saved = _backup_settling(config.train_dir)
    if saved is not None:
        log.info("resuming: the backup's starting model stands")
        return dataclasses.replace(
            config,
            warm_start_from=saved["warm_start_from"],
            warm_start_sha256=saved["warm_start_sha256"],
            warm_start_date=saved["warm_start_date"],
            cold_start_reason=saved["cold_start_reason"],
        )
    root, run_date = config.run()
    try:
        current = pointer.read(root)
    except pointer.PointerUnreadableError as e:
        return _cold(config, str(e))
    if current is None:
        return _cold(config, f"no blessed model yet ({pointer.pointer_path(root)} is missing)")
    if dates.is_run_date(run_date) and not dates.is_later(run_date, current.get("date")):
        earlier = history.last_blessed_before(root, run_date)
        if earlier is None:
            return _cold(
                config,
                f"the latest pointer names {current.get('date')}, not a night before this run's "
                f"{run_date} (a retrain of the date or a backfill), and the run history has no "
                "blessed night before it",
            )
        log.info(
            "the latest pointer names %s, not a night before %s: starting from %s, the last "
            "blessed night before it",
            current.get("date"),
            run_date,
            earlier["date"],
        )
        current = earlier
    if not current.get("model_path"):
        return _cold(config, f"the latest pointer {pointer.pointer_path(root)} names no model")
    other = lineage.differences(current.get(pointer.IDENTITY_KEY), lineage.identity(shard_manifest))
    if other:
        return _cold(
            config,
            f"the last blessed model (run {current.get('date')}) is a model of another dataset "
            f"lineage ({other})",
        )
    path = pointer.resolve(root, str(current["model_path"]))
    date = str(current.get("date", ""))
    own = layout.join(config.train_dir.rstrip("/"), layout.MODEL_FILE)
    if _same_file(path, own):
        return _cold(config, f"the latest pointer names this run's own model {path}")
    if not gfile.exists(path):
        return _cold(config, f"the last blessed model {path} (run {date}) is missing")
    sha256 = atomic.sha256_file(path)
    if sha256 != current.get("model_sha256"):
        return _cold(
            config,
            f"the last blessed model {path} (run {date}) fails its sha256: "
            f"{sha256[:16]}… is not the pointer's {str(current.get('model_sha256'))[:16]}…",
        )
    import tf_keras as keras

    from train import models

    try:
        blessed = signature(_load_core(path))
    except Exception as e:  # noqa: BLE001 - an unreadable model is a reason to start cold
        return _cold(config, f"the last blessed model {path} could not be loaded: {e}")
    keras.backend.clear_session()  # this run's layer names, as a fresh worker gives them
    try:
        built = signature(models.build_for_run(config.resolved(), shard_manifest))
    finally:
        keras.backend.clear_session()
        keras.mixed_precision.set_global_policy("float32")
    difference = describe_mismatch(built, blessed)
    if difference:
        return _cold(
            config,
            f"the last blessed model {path} (run {date}) does not fit model {config.model!r} "
            f"on this shard set: {difference}",
        )
    log.info("warm start from %s (run %s, sha256 %s)", path, date, sha256)
    return dataclasses.replace(
        config, warm_start_from=path, warm_start_sha256=sha256, warm_start_date=date
    )


def _cold(config: TrainConfig, reason: str) -> TrainConfig:
    log.warning("cold start: %s", reason)
    return dataclasses.replace(config, cold_start_reason=reason)


def _same_file(a: str, b: str) -> bool:
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return posixpath.normpath(posixpath.abspath(a)) == posixpath.normpath(posixpath.abspath(b))


def _backup_settling(train_dir: str) -> dict[str, str] | None:
    """The warm-start fields a resumable backup in `train_dir` was made with, if any."""
    if not has_backup_folder(train_dir):
        return None
    from train import backup

    path = layout.join(backup.backup_dir(train_dir), backup.SETTINGS_FILE)
    if not backup.has_checkpoint(train_dir) or not gfile.exists(path):
        return None
    saved = atomic.read_json(path)
    if not any(saved.get(name) for name in SETTLED_FIELDS):
        return None
    return {name: str(saved.get(name, "")) for name in SETTLED_FIELDS}


def signature(model: keras.Model) -> WeightsSignature:
    """Each weight's name and shape, in the model's order."""
    return [(w.name, tuple(int(d) for d in w.shape)) for w in model.weights]


def describe_mismatch(built: WeightsSignature, blessed: WeightsSignature) -> str:
    """ "" when the two models' weights agree in names and shapes, else the first difference."""
    if len(built) != len(blessed):
        return f"{len(blessed)} weights where this run's model has {len(built)}"
    for (name, shape), (other_name, other_shape) in zip(built, blessed, strict=True):
        if (name, shape) != (other_name, other_shape):
            return (
                f"weight {other_name} {list(other_shape)} where this run has {name} {list(shape)}"
            )
    return ""


def _load_core(path: str) -> keras.Model:
    """The trained model inside an exported one: the model itself, or the model that
    test-time flips wrap (`train.models.mirror_averaged`)."""
    import tf_keras as keras

    # A user's own layers load from their module (docs/extending.md).
    custom = model_code.custom_objects(path)
    loaded = keras.models.load_model(path, compile=False, custom_objects=custom)
    nested = [layer for layer in loaded.layers if isinstance(layer, keras.Model)]
    return nested[0] if len(nested) == 1 else loaded


def load_into(core: keras.Model, config: TrainConfig) -> None:
    """Sets `core`'s weights to the settled starting model's, on a fresh start.

    Raises:
        ConfigError: the file changed since the launcher settled it (every worker checks).
    """
    path = config.warm_start_from
    if not path:
        if config.warm_start != "off":
            log.info("cold start: %s", config.cold_start_reason)
        return
    if not gfile.exists(path) or atomic.sha256_file(path) != config.warm_start_sha256:
        raise ConfigError(
            f"the warm start model {path} is missing or changed since the launch chose it "
            f"(sha256 {config.warm_start_sha256[:16]}…): rerun the train stage"
        )
    blessed = _load_core(path)
    difference = describe_mismatch(signature(core), signature(blessed))
    if difference:
        raise ConfigError(f"the warm start model {path} does not fit this run: {difference}")
    core.set_weights(blessed.get_weights())
    log.info("warm start: loaded the weights of %s (run %s)", path, config.warm_start_date)


def learning_rate(config: TrainConfig) -> float:
    """The run's (peak) learning rate: `warm_start_learning_rate` when it starts warm and
    that is set, else `learning_rate`."""
    if config.warm_start_from and config.warm_start_learning_rate > 0:
        return config.warm_start_learning_rate
    return config.learning_rate


def finetune_epochs(config: TrainConfig) -> int:
    """The epochs the run fine-tunes its starting model before its schedule: 0 unless it
    starts warm."""
    return config.warm_start_finetune_epochs if config.warm_start_from else 0


def total_epochs(config: TrainConfig) -> int:
    """The epochs the run trains: its fine-tune's, then the schedule's `epochs`."""
    return finetune_epochs(config) + config.epochs


def finetune_learning_rate(config: TrainConfig) -> float:
    """The fine-tune's starting rate: `warm_start_finetune_learning_rate`, or a tenth of the
    run's peak."""
    return config.warm_start_finetune_learning_rate or learning_rate(config) / 10


def record(config: TrainConfig) -> dict[str, Any]:
    """What history.json says about the run's starting model."""
    return {
        "mode": config.warm_start,
        "started_from": (
            {
                "model_path": config.warm_start_from,
                "model_sha256": config.warm_start_sha256,
                "run_date": config.warm_start_date,
            }
            if config.warm_start_from
            else None
        ),
        "cold_start_reason": config.cold_start_reason,
        "learning_rate": learning_rate(config),
        "finetune_epochs": finetune_epochs(config),
        "finetune_learning_rate": finetune_learning_rate(config)
        if finetune_epochs(config)
        else 0.0,
    }


def notice(config: TrainConfig) -> str:
    """The launcher's line about the starting model ("" when warm start is off)."""
    if config.warm_start == "off":
        return ""
    if config.warm_start_from:
        return (
            f"warm start from the model blessed on {config.warm_start_date} "
            f"({config.warm_start_from})"
        )
    return f"cold start: {config.cold_start_reason}"
