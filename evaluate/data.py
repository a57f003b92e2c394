"""Reading the eval split once, in full, as batches of (float32 pixels 0-255, labels)."""

from __future__ import annotations

from typing import Any

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
    paths = manifest.split_paths(data_dir, doc, layout.EVAL_SPLIT)
    image_shape = list(doc["image_shape"])

    def parse(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        images, labels = records.parse_batch(serialized, image_shape)
        return tf.cast(images, tf.float32), labels

    return (
        tf.data.TFRecordDataset(paths, num_parallel_reads=min(len(paths), 4))
        .batch(batch_size)
        .map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )
