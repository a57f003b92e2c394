"""Reading the eval split once, in full, as batches of (float32 pixels 0-255, labels), and the
drop day of each of its examples."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from contract import layout, manifest, records


class EvalSplitError(Exception):
    """The eval split on disk does not add up to what the manifest promises."""


def expected_eval_count(doc: dict[str, Any]) -> int:
    """The eval split's size from the manifest, checked against its own file entries.

    Raises:
        EvalSplitError: the split's declared size and its files' sizes disagree, or it is empty.
    """
    declared = int(doc["splits"][layout.EVAL_SPLIT]["num_examples"])
    in_files = sum(int(f["num_examples"]) for f in manifest.file_entries(doc, layout.EVAL_SPLIT))
    if declared != in_files:
        raise EvalSplitError(
            f"manifest is inconsistent: splits.eval.num_examples is {declared} but its eval "
            f"files hold {in_files} examples; rerun the preprocess stage"
        )
    if declared == 0:
        raise EvalSplitError("manifest declares an empty eval split; rerun the preprocess stage")
    return declared


def eval_dataset(data_dir: str, doc: dict[str, Any], batch_size: int) -> tf.data.Dataset:
    """The whole eval split, read once: no shuffle, no repeat, no step cap.

    Batches are parsed whole (one parse_example per batch, not per record) and the pixels are
    cast to float32 but not rescaled: the model rescales inside, as the train contract says.
    """
    image_shape = list(doc["image_shape"])

    @tf.autograph.experimental.do_not_convert  # plain ops: nothing for autograph to convert
    def parse(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        images, labels = records.parse_batch(serialized, image_shape)
        return tf.cast(images, tf.float32), labels

    return (
        _eval_records(data_dir, doc)
        .batch(batch_size)
        .map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )


def _eval_records(data_dir: str, doc: dict[str, Any]) -> tf.data.Dataset:
    """The eval split's serialised records, in the one order every reader here sees them."""
    paths = manifest.split_paths(data_dir, doc, layout.EVAL_SPLIT)
    return tf.data.TFRecordDataset(paths, num_parallel_reads=min(len(paths), 4))


def eval_days(data_dir: str, doc: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """The drop day of every eval example (contract.records.DAY_KEY) and its label, in the
    order `eval_dataset` reads them; None unless the shard set is of daily drops and some of
    its eval examples carry a day (an eval split of undated test files carries none).

    Returns:
        (days [N] str, "" for an example without one; labels [N] int64).
    """
    if not doc.get(manifest.DROPS_KEY):
        return None
    spec = records.day_spec() | {records.LABEL_KEY: records.feature_spec()[records.LABEL_KEY]}
    days, labels = [], []
    for batch in (
        _eval_records(data_dir, doc)
        .batch(4096)
        .map(tf.autograph.experimental.do_not_convert(lambda s: tf.io.parse_example(s, spec)))
    ):
        days.append(batch[records.DAY_KEY].numpy())
        labels.append(batch[records.LABEL_KEY].numpy())
    if not days:
        return None
    found = np.array([d.decode() for d in np.concatenate(days)], dtype=object)
    if not any(found):
        return None
    return found, np.concatenate(labels)
