"""Scoring the last blessed model (the `latest` pointer's) on this run's eval set.

Every way it can fail to be scored is named, and the verdict then falls back to the value
threshold: the pointer names another dataset or one of another identity (adapter, name, image
shape, classes: contract.lineage), records no sha256 for its model, its model file is missing
or no longer matches the sha256 recorded with it, the file does not load, or the model takes
another input shape or predicts another number of classes than this run's shard set has.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import tensorflow as tf
import tf_keras

from contract import atomic, lineage, model_code, pointer
from evaluate import paired
from evaluate.blessing import Baseline
from evaluate.predictions import Predictions

logger = logging.getLogger(__name__)

# Any exception in loading or running a stored model means "cannot be scored any more".
_Scorer = Callable[[tf_keras.Model], tuple[dict[str, Any], Predictions]]


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def _input_problem(model: tf_keras.Model, image_shape: list[int]) -> str | None:
    """Why the model cannot take this run's images, or None when it can (or does not say)."""
    try:
        shape = model.input_shape
    except AttributeError:  # a subclassed model declaring no input: scoring it finds out
        return None
    if isinstance(shape, list):
        return f"it takes {len(shape)} inputs, this run has one image input"
    dims = list(shape[1:])
    if len(dims) != len(image_shape) or any(
        d is not None and d != want for d, want in zip(dims, image_shape, strict=True)
    ):
        return f"it takes inputs of shape {dims}, this run's images are {list(image_shape)}"
    return None


def score(
    output_root: str,
    current: dict[str, Any],
    *,
    dataset: str,
    image_shape: list[int],
    scorer: _Scorer,
    candidate: Predictions,
    confidence: float,
    identity: dict[str, Any] | None = None,
) -> Baseline:
    """Scores the model `current` (the pointer) names with `scorer`, or says why it cannot.

    Args:
        output_root: the root the pointer's paths are relative to.
        current: the latest pointer.
        dataset: this run's dataset name.
        image_shape: this run's image shape.
        scorer: scores a loaded model on this run's eval set (the candidate's scorer), giving
            the metrics document (accuracy, loss, ...) and the per-example predictions.
        candidate: the candidate's per-example predictions on the same examples.
        confidence: the level of the paired comparison's interval.
        identity: this run's dataset identity (contract.lineage.identity); a pointer recording
            another is not compared with (one written before pointers recorded it is).

    Returns:
        The baseline, with its accuracy, loss, predictions and paired comparison with the
        candidate, or with the reason it was not scored.
    """

    def unscored(reason: str) -> Baseline:
        logger.warning("the last blessed model cannot be scored: %s", reason)
        return Baseline(pointer=current, unscored_reason=reason)

    if current.get("dataset") not in (None, dataset):
        return unscored(f"it was trained on dataset {current.get('dataset')!r}, not {dataset!r}")
    recorded = current.get(pointer.IDENTITY_KEY)
    if recorded is None:
        logger.info(
            "the latest pointer (%s) records no dataset identity (written before pointers "
            "did): compared by its dataset name alone",
            current.get("date"),
        )
    elif (differ := lineage.differences(recorded, identity)) is not None:
        return unscored(f"it is a model of another dataset lineage ({differ}): not compared")
    model_path = current.get("model_path")
    if not isinstance(model_path, str) or not model_path:
        return unscored("the latest pointer names no model_path")
    path = pointer.resolve(output_root, model_path)
    if not tf.io.gfile.exists(path):
        return unscored(f"its model file {path} is missing")
    recorded = current.get("model_sha256")
    if not recorded:
        # Only a model known to be the one that was blessed is loaded and compared with.
        return unscored(
            "the latest pointer records no model_sha256, so its model file cannot be checked "
            "to be the one that was blessed"
        )
    found = atomic.sha256_file(path)
    if found != recorded:
        return unscored(
            f"its model file {path} has sha256 {found[:16]}…, not the {str(recorded)[:16]}… "
            "recorded in the latest pointer"
        )
    try:
        custom = model_code.custom_objects(path)  # a user's own layers (docs/extending.md)
        model = tf_keras.models.load_model(path, compile=False, custom_objects=custom)
    except Exception as e:  # noqa: BLE001 - whatever a stored file throws, it is unusable
        return unscored(f"its model file {path} does not load ({_first_line(e)})")
    problem = _input_problem(model, image_shape)
    if problem is not None:
        return unscored(problem)
    try:
        metrics, predictions = scorer(model)
    except Exception as e:  # noqa: BLE001 - e.g. another class count (scoring.score names it)
        return unscored(f"scoring it failed ({_first_line(e)})")
    logger.info(
        "the last blessed model (%s) scores accuracy %.4f on this run's eval set",
        current.get("date"),
        metrics["accuracy"],
    )
    if not (predictions.labels == candidate.labels).all():
        return unscored("its scoring read the eval examples in another order than the candidate's")
    return Baseline(
        pointer=current,
        accuracy=float(metrics["accuracy"]),
        loss=float(metrics["loss"]),
        comparison=paired.compare(candidate.correct, predictions.correct, confidence=confidence),
        predictions=predictions,
    )
