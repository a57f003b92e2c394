"""`run(config)`: evaluate the chief's final model on the whole eval split and bless it or not.

The last blessed model (the one `<output_root>/latest.json` names) is scored on the same eval
split as the candidate, and the verdict weighs both (evaluate.blessing). Writes into
`<output_root>/<date>/evaluate/`: the pictures, the per-example predictions of the candidate
and of the baseline (evaluate.predictions), blessing.json (the verdict, every time),
push.json, report.md, report.html and, last and atomically, metrics.json (the stage's
completion marker). A blessed run is pushed to serving as a SavedModel
(`<export_base>/<model_name>/<YYYYMMDDNN>/`, evaluate.serving) and moves the latest pointer to
its model. Then it rewrites the nightly trend page, `<output_root>/index.html` (evaluate.trend).
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras

from contract import (
    atomic,
    dates,
    gfile,
    history,
    layout,
    lineage,
    manifest,
    model_code,
    pointer,
)
from evaluate import (
    baseline,
    blessing,
    data,
    plots,
    predictions,
    report,
    report_page,
    scoring,
    served,
    serving,
    trend,
    versions,
)
from evaluate.config import EvaluateConfig
from evaluate.predictions import Predictions

logger = logging.getLogger(__name__)

# Eval records an export is checked on before it is pushed (the first ones of the split).
VERIFY_EXAMPLES = 256

# What the metrics keep of the train stage's history.json (the curves go into the picture).
TRAINING_SUMMARY_KEYS = (
    "epochs_completed",
    "stopped_early",
    "best_epoch",
    "steps_trained_total",
    "num_workers",
    "global_batch_size",
    "model",
)


class TrainOutputError(Exception):
    """The train stage's model or history is missing or unreadable."""


def read_history(path: str) -> dict[str, Any]:
    """Reads the train stage's history.json (written last, so its presence means train is done).

    Raises:
        TrainOutputError: the file is missing or lacks the per-epoch `history` object.
    """
    if not tf.io.gfile.exists(path):
        raise TrainOutputError(f"training history not found: {path} (run the train stage first)")
    doc = atomic.read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("history"), dict):
        raise TrainOutputError(f"{path} has no 'history' object; rerun the train stage")
    return doc


def load_model(path: str) -> tf_keras.Model:
    """Loads the chief's final model for inference only (the loss is computed here).

    Raises:
        TrainOutputError: the model file is missing or unreadable (truncated, not a model).
    """
    if not tf.io.gfile.exists(path):
        raise TrainOutputError(f"model not found: {path} (run the train stage first)")
    try:
        # A user's own layers load from their module (docs/extending.md).
        custom = model_code.custom_objects(path)
        return tf_keras.models.load_model(path, compile=False, custom_objects=custom)
    except model_code.ModelCodeError:
        raise  # names the module or class itself
    except Exception as e:  # noqa: BLE001 - zip, HDF5 and Keras each raise their own kind
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise TrainOutputError(
            f"model {path} is unreadable ({type(e).__name__}: {reason}): it is truncated or "
            "not a Keras model; rerun the train stage (--force-stage train)"
        ) from None


def score_model(
    config: EvaluateConfig, doc: dict[str, Any], model: tf_keras.Model
) -> tuple[dict[str, Any], Predictions]:
    """Scores `model` on the whole eval split and checks the example count.

    Returns:
        The metrics document and the per-example predictions, in split order.

    Raises:
        data.EvalSplitError: fewer or more examples were read than the manifest declares.
    """
    expected = data.expected_eval_count(doc)
    started = time.perf_counter()
    labels, probabilities = scoring.predict_split(
        model, data.eval_dataset(config.data_dir, doc, config.batch_size)
    )
    seconds = time.perf_counter() - started
    if labels.shape[0] != expected:
        raise data.EvalSplitError(
            f"read {labels.shape[0]} eval examples but the manifest declares {expected} "
            f"(splits.eval.num_examples in {config.data_dir}); rerun the preprocess stage"
        )
    metrics = scoring.score(labels, probabilities, list(doc["class_names"]))
    logger.info(
        "evaluated %d examples in %.1f s: accuracy %.4f, loss %.4f",
        expected,
        seconds,
        metrics["accuracy"],
        metrics["loss"],
    )
    return metrics, Predictions.from_probabilities(labels, probabilities)


def _accuracy_by_day(
    config: EvaluateConfig, doc: dict[str, Any], candidate: Predictions
) -> list[dict[str, Any]] | None:
    """The candidate's accuracy per drop day of the eval split, or None when its examples
    carry no day (evaluate.data.eval_days)."""
    found = data.eval_days(config.data_dir, doc)
    if found is None:
        return None
    days, labels = found
    if not np.array_equal(labels, candidate.labels):
        raise data.EvalSplitError(
            f"the eval split in {config.data_dir} was read in another order for its days than "
            "for scoring; rerun the evaluation"
        )
    return scoring.accuracy_by_day(days, candidate.correct)


def evaluate_split(config: EvaluateConfig, doc: dict[str, Any]) -> dict[str, Any]:
    """Scores the run's model (`config.model_path`) on the whole eval split."""
    metrics, _ = score_model(config, doc, load_model(config.model_path))
    return metrics


def _baseline(
    config: EvaluateConfig,
    doc: dict[str, Any],
    current: dict[str, Any] | None,
    candidate: Predictions,
) -> blessing.Baseline | None:
    """The pointer's model scored on this run's eval set, or None when there is no baseline.

    A pointer naming a date without metrics.json is left by an evaluation that crashed after
    moving it: that date is not a baseline (and for its own rerun, not its own baseline).
    """
    if current is None or not pointer.is_complete(config.output_root, current):
        return None
    return baseline.score(
        config.output_root,
        current,
        dataset=config.dataset,
        image_shape=list(doc["image_shape"]),
        scorer=lambda model: score_model(config, doc, model),
        candidate=candidate,
        confidence=config.confidence,
        identity=lineage.identity(doc),
    )


def _baseline_problem(config: EvaluateConfig, current: dict[str, Any] | None) -> str | None:
    """Why a pointer that exists is no baseline at all (`contract.pointer.problem`).

    None without a pointer, for a complete one (scoring it names what is wrong, see
    evaluate.baseline) and for this date's own evaluation that stopped before metrics.json.
    """
    if current is None or pointer.is_complete(config.output_root, current):
        return None
    if current.get("date") == config.date and pointer.model_exists(config.output_root, current):
        return None
    found = pointer.problem(config.output_root, current)
    if found is not None:
        logger.warning("%s", found)
    return found


def _verification_examples(config: EvaluateConfig, doc: dict[str, Any]) -> list[bytes]:
    """The first eval records, serialised, to check an export on."""
    paths = manifest.split_paths(config.data_dir, doc, layout.EVAL_SPLIT)
    records = tf.data.TFRecordDataset(paths).take(VERIFY_EXAMPLES)
    return [bytes(r.numpy()) for r in records]


def _push(
    config: EvaluateConfig,
    doc: dict[str, Any],
    model: tf_keras.Model,
    metrics: dict[str, Any],
    verdict: dict[str, Any],
) -> dict[str, Any]:
    """Pushes a blessed model to serving; the push document (push.json) either way.

    Raises:
        serving.ExportError: the export failed its checks or its version holds another model.
    """
    sequence = served.next_sequence(
        config.serving_base, config.model_name, config.date, metrics["model"]["sha256"]
    )
    version = versions.version_for_date(config.date, sequence)
    path = layout.join(config.serving_base, config.model_name, str(version))
    if not verdict["blessed"]:
        return {
            "pushed": False,
            "status": "not blessed",
            "reason": "only a blessed model is pushed to serving",
            "path": path,
            "version": version,
            "model_name": config.model_name,
            "export_base": config.serving_base,
        }
    return serving.push(
        serving.PushRequest(
            model=model,
            model_sha256=metrics["model"]["sha256"],
            export_base=config.serving_base,
            model_name=config.model_name,
            date=config.date,
            image_shape=list(doc["image_shape"]),
            class_names=list(doc["class_names"]),
            serialized_examples=_verification_examples(config, doc),
            sequence=sequence,
        ),
        serving.FORMATS[config.export_format],
    )


def _write_report(
    config: EvaluateConfig,
    metrics: dict[str, Any],
    verdict: dict[str, Any],
    push: dict[str, Any],
    pictures: dict[str, bytes],
) -> None:
    """Writes push.json, report.md and report.html (`pictures`, PNG bytes by file name,
    embedded) for this verdict and push."""
    out = config.evaluate_dir
    atomic.write_json_atomic(layout.join(out, report.PUSH_FILE), push)
    atomic.write_bytes_atomic(
        layout.join(out, report.REPORT_FILE), report.render(metrics, verdict, push).encode()
    )
    atomic.write_bytes_atomic(
        layout.join(out, report_page.REPORT_HTML_FILE),
        report_page.render(metrics, verdict, push, pictures).encode(),
    )


def _take_back(
    config: EvaluateConfig, model_sha256: str, verdict: dict[str, Any], identity: dict[str, Any]
) -> str | None:
    """Takes the pointer back from this run's model when this evaluation does not bless it.

    A re-evaluation with stricter thresholds (`--force-stage evaluate`) can reject the model
    the pointer names; the pointer then returns to the last blessed, not rolled-back night
    before this date of the same dataset `identity` (its served version moved back from
    quarantine if need be), or is removed when there is none. The caller holds the pointer's
    lock.

    Returns:
        What was done, in one sentence, or None when the pointer names another night's model.
    """
    current = pointer.read(config.output_root)
    if verdict["blessed"] or current is None:
        return None
    # This date's own model: another night's file with the same bytes is not taken back.
    if current.get("date") != config.date or current.get("model_sha256") != model_sha256:
        return None
    previous = history.last_blessed_before(config.output_root, config.date, identity)
    if previous is None:
        gfile.remove(config.latest_pointer_path)
        said = (
            f"latest.json named this model, which this evaluation does not bless, and no "
            f"earlier blessed night is left to return to: {config.latest_pointer_path} removed"
        )
    else:
        if previous["version"] not in served.served_versions(
            config.serving_base, config.model_name
        ):
            served.restore(
                config.serving_base,
                config.model_name,
                previous["version"],
                previous["model_sha256"],
            )
        pointer.write(config.output_root, previous)
        said = (
            f"latest.json named this model, which this evaluation does not bless: taken back "
            f"to {previous['date']}, the last blessed night before it"
        )
    logger.warning("%s", said)
    return said


def run(config: EvaluateConfig) -> dict[str, Any]:
    """Evaluates one run's model against the last blessed one, pushes it and moves `latest`
    if blessed.

    Returns:
        The metrics document, as written to metrics.json.

    Raises:
        manifest.ManifestError: the eval split does not match its manifest.
        data.EvalSplitError: the eval split's size is not what the manifest declares.
        TrainOutputError: the train stage's model or history is missing.
        serving.ExportError: the export base is a file, the export does not predict what the
            model predicts, or its version holds another model.
        ValueError: the manifest names another dataset than `config.dataset`.
    """
    serving.check_export_base(config.serving_base)
    pointer.read(config.output_root)  # an unreadable latest.json is refused before any work
    doc = manifest.verify(config.data_dir, split=layout.EVAL_SPLIT)
    if doc["dataset"]["name"] != config.dataset:
        raise ValueError(
            f"the shard set in {config.data_dir} is {doc['dataset']['name']!r}, "
            f"not {config.dataset!r}: pass --dataset {doc['dataset']['name']} or rerun preprocess"
        )
    history = read_history(config.history_path)
    identity = lineage.identity(doc)
    model = load_model(config.model_path)
    metrics, candidate = score_model(config, doc, model)
    metrics["calibration"] = predictions.calibration(candidate)
    metrics["accuracy_by_day"] = _accuracy_by_day(config, doc, candidate)
    metrics.update(
        {
            "date": config.date,
            "model": {
                "path": pointer.relative(config.output_root, config.model_path),
                "sha256": atomic.sha256_file(config.model_path),
                "training": {k: history[k] for k in TRAINING_SUMMARY_KEYS if k in history},
            },
            "dataset": {
                "name": doc["dataset"]["name"],
                "version": doc["dataset"]["version"],
                "split": doc["dataset"].get("eval_split", layout.EVAL_SPLIT),
                "manifest": pointer.relative(
                    config.output_root, layout.join(config.data_dir, layout.MANIFEST_FILE)
                ),
                "identity": identity,
            },
            "created_utc": datetime.datetime.now(datetime.UTC).isoformat(),
        }
    )

    out = config.evaluate_dir
    tf.io.gfile.makedirs(out)
    candidate.write(layout.join(out, predictions.CANDIDATE_FILE))
    pictures = {
        report.CONFUSION_MATRIX_PNG: plots.write_confusion_matrix(
            metrics["confusion_matrix"]["matrix"],
            list(doc["class_names"]),
            layout.join(out, report.CONFUSION_MATRIX_PNG),
        ),
        report.TRAINING_CURVES_PNG: plots.write_training_curves(
            history["history"], layout.join(out, report.TRAINING_CURVES_PNG)
        ),
        report.RELIABILITY_PNG: plots.write_reliability_diagram(
            metrics["calibration"], layout.join(out, report.RELIABILITY_PNG)
        ),
    }
    # Reading the pointer, scoring its model, deciding, pushing and moving the pointer happen
    # under the lock shared with supersede (so the baseline cannot change under the verdict;
    # on gs://, where the lock is per machine, the pointer is written only at the generation
    # that was read, and a pointer another host moved meanwhile is read, scored and decided
    # on again); metrics.json, the completion marker, is written after the pointer moved (see
    # contract.pointer for why a crash in between stays consistent). A failed push leaves the
    # verdict written but neither the pointer moved nor metrics.json.
    decided: dict[str, Any] = {}

    def decide(current: dict[str, Any] | None) -> dict[str, Any] | None:
        scored = _baseline(config, doc, current, candidate)
        baseline_file = layout.join(out, predictions.BASELINE_FILE)
        if scored is not None and scored.predictions is not None:
            scored.predictions.write(baseline_file)
        elif tf.io.gfile.exists(baseline_file):
            tf.io.gfile.remove(baseline_file)  # an earlier verdict's baseline, not this one's
        verdict = blessing.decide(
            date=config.date,
            accuracy=metrics["accuracy"],
            thresholds=config.thresholds,
            baseline=scored,
            baseline_problem=_baseline_problem(config, current),
        )
        if (
            verdict["moves_latest_pointer"]
            and current is not None
            and dates.is_later(current.get("date"), config.date)
        ):
            # An unfinished newer evaluation holds the pointer: a backfill never takes it.
            verdict["moves_latest_pointer"] = False
            verdict["reasons"].append(
                f"blessed, but the latest pointer stays on the newer run {current['date']} "
                "(its evaluation is not finished yet)"
            )
        metrics["blessed"] = verdict["blessed"]
        metrics["baseline_accuracy"] = (verdict["baseline"] or {}).get("accuracy")
        metrics["comparison"] = verdict["comparison"]
        atomic.write_json_atomic(layout.join(out, layout.BLESSING_FILE), verdict)
        push = _push(config, doc, model, metrics, verdict)
        metrics["push"] = {k: push.get(k) for k in ("pushed", "status", "version", "path")}
        _write_report(config, metrics, verdict, push, pictures)
        decided["verdict"] = verdict
        decided["push"] = push
        if not verdict["moves_latest_pointer"]:
            return None
        # Stored relative to output_root: a moved or re-mounted runs folder keeps it valid.
        return {
            "date": config.date,
            "model_path": config.model_path,
            "model_sha256": metrics["model"]["sha256"],
            "accuracy": metrics["accuracy"],
            "loss": metrics["loss"],
            "dataset": config.dataset,
            pointer.IDENTITY_KEY: identity,
            "metrics_path": layout.join(out, layout.METRICS_FILE),
            "version": push["version"],
            "updated_utc": verdict["decided_utc"],
        }

    # Served versions newer than the pointer's (a push whose pointer move never happened) are
    # quarantined before deciding and again after: a retried pointer write may have decided
    # otherwise than the push did (evaluate.served).
    with pointer.pointer_lock(config.output_root):
        served.reconcile(config.output_root, config.serving_base, config.model_name)
        if pointer.update(config.output_root, decide, locked=True) is not None:
            logger.info(
                "blessed: %s now points at %s", config.latest_pointer_path, config.model_path
            )
        else:
            verdict = decided["verdict"]
            logger.info("not moving the latest pointer: %s", "; ".join(verdict["reasons"]))
            taken_back = _take_back(config, metrics["model"]["sha256"], verdict, identity)
            if taken_back is not None:
                verdict["reasons"].append(taken_back)
                atomic.write_json_atomic(layout.join(out, layout.BLESSING_FILE), verdict)
                _write_report(config, metrics, verdict, decided["push"], pictures)
        served.reconcile(config.output_root, config.serving_base, config.model_name)
    # Last: its presence is what marks the stage complete.
    atomic.write_json_atomic(layout.join(out, layout.METRICS_FILE), metrics)
    # After the marker, so the page has this night's row; under the pointer's lock again, so
    # an evaluation of another date running at the same time cannot drop it.
    trend.update_page(config.output_root)
    return metrics
