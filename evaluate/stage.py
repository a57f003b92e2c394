"""`run(config)`: evaluate the chief's final model on the whole eval split and bless it or not.

Writes into `<output_root>/<date>/evaluate/`: the pictures, report.md, report.html,
blessing.json and, last and atomically, metrics.json (the stage's completion marker). A blessed
run also moves the `<output_root>/latest.json` pointer to its model. Then it rewrites the
nightly trend page, `<output_root>/index.html` (evaluate.trend).
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any

import tensorflow as tf
import tf_keras

from contract import atomic, layout, manifest, pointer
from evaluate import blessing, data, plots, report, report_page, scoring, trend
from evaluate.config import EvaluateConfig

logger = logging.getLogger(__name__)

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
        TrainOutputError: the model file is missing.
    """
    if not tf.io.gfile.exists(path):
        raise TrainOutputError(f"model not found: {path} (run the train stage first)")
    return tf_keras.models.load_model(path, compile=False)


def evaluate_split(config: EvaluateConfig, doc: dict[str, Any]) -> dict[str, Any]:
    """Scores the model on the whole eval split and checks the example count.

    Raises:
        data.EvalSplitError: fewer or more examples were read than the manifest declares.
    """
    expected = data.expected_eval_count(doc)
    model = load_model(config.model_path)
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
    return metrics


def _comparable_baseline(
    config: EvaluateConfig, current: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The pointer as the comparison baseline, or None when its evaluation is unfinished.

    A pointer naming a date without metrics.json is left by an evaluation that crashed after
    moving it: that date is not a baseline (and for its own rerun, not its own baseline).
    """
    if current is None or not pointer.is_complete(config.output_root, current):
        return None
    return current


def _write_verdict(
    config: EvaluateConfig,
    metrics: dict[str, Any],
    verdict: dict[str, Any],
    pictures: dict[str, bytes],
) -> None:
    """Writes report.md, report.html (`pictures`, PNG bytes by file name, embedded) and
    blessing.json for this verdict."""
    out = config.evaluate_dir
    atomic.write_bytes_atomic(
        layout.join(out, report.REPORT_FILE), report.render(metrics, verdict).encode()
    )
    atomic.write_bytes_atomic(
        layout.join(out, report_page.REPORT_HTML_FILE),
        report_page.render(metrics, verdict, pictures).encode(),
    )
    atomic.write_json_atomic(layout.join(out, layout.BLESSING_FILE), verdict)


def run(config: EvaluateConfig) -> dict[str, Any]:
    """Evaluates one run's model, writes the report and blessing, and moves `latest` if blessed.

    Returns:
        The metrics document, as written to metrics.json.

    Raises:
        manifest.ManifestError: the eval split does not match its manifest.
        data.EvalSplitError: the eval split's size is not what the manifest declares.
        TrainOutputError: the train stage's model or history is missing.
        ValueError: the manifest names another dataset than `config.dataset`.
    """
    doc = manifest.verify(config.data_dir, split=layout.EVAL_SPLIT)
    if doc["dataset"]["name"] != config.dataset:
        raise ValueError(
            f"the shard set in {config.data_dir} is {doc['dataset']['name']!r}, "
            f"not {config.dataset!r}: pass --dataset {doc['dataset']['name']} or rerun preprocess"
        )
    history = read_history(config.history_path)
    metrics = evaluate_split(config, doc)
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
            },
            "created_utc": datetime.datetime.now(datetime.UTC).isoformat(),
        }
    )

    out = config.evaluate_dir
    tf.io.gfile.makedirs(out)
    pictures = {
        report.CONFUSION_MATRIX_PNG: plots.write_confusion_matrix(
            metrics["confusion_matrix"]["matrix"],
            list(doc["class_names"]),
            layout.join(out, report.CONFUSION_MATRIX_PNG),
        ),
        report.TRAINING_CURVES_PNG: plots.write_training_curves(
            history["history"], layout.join(out, report.TRAINING_CURVES_PNG)
        ),
    }
    # Reading, deciding and moving the pointer happen under the lock shared with supersede;
    # metrics.json, the completion marker, is written after the pointer moved (see
    # contract.pointer for why a crash in between stays consistent).
    with pointer.pointer_lock(config.output_root):
        current = pointer.read(config.output_root)
        verdict = blessing.decide(
            date=config.date,
            dataset=config.dataset,
            accuracy=metrics["accuracy"],
            min_accuracy=config.min_accuracy,
            max_regression=config.max_regression,
            baseline=_comparable_baseline(config, current),
        )
        if (
            verdict["moves_latest_pointer"]
            and current is not None
            and str(current.get("date", "")) > config.date
        ):
            # An unfinished newer evaluation holds the pointer: a backfill never takes it.
            verdict["moves_latest_pointer"] = False
            verdict["reasons"].append(
                f"blessed, but the latest pointer stays on the newer run {current['date']} "
                "(its evaluation is not finished yet)"
            )
        metrics["blessed"] = verdict["blessed"]
        _write_verdict(config, metrics, verdict, pictures)
        if verdict["moves_latest_pointer"]:
            # Stored relative to output_root: a moved or re-mounted runs folder keeps it valid.
            pointer.write(
                config.output_root,
                {
                    "date": config.date,
                    "model_path": config.model_path,
                    "model_sha256": metrics["model"]["sha256"],
                    "accuracy": metrics["accuracy"],
                    "loss": metrics["loss"],
                    "dataset": config.dataset,
                    "metrics_path": layout.join(out, layout.METRICS_FILE),
                    "updated_utc": verdict["decided_utc"],
                },
            )
            logger.info(
                "blessed: %s now points at %s", config.latest_pointer_path, config.model_path
            )
        else:
            logger.info("not moving the latest pointer: %s", "; ".join(verdict["reasons"]))
    # Last: its presence is what marks the stage complete.
    atomic.write_json_atomic(layout.join(out, layout.METRICS_FILE), metrics)
    # After the marker, so the page has this night's row; under the pointer's lock again, so
    # an evaluation of another date running at the same time cannot drop it.
    trend.update_page(config.output_root)
    return metrics
