"""The record format of every shard: a tf.train.Example with raw image bytes and a label.

A record of a daily-drops dataset also carries `day`, the date (YYYY-MM-DD, as bytes) of the
drop it came from; records of an undated file, and of every other dataset, have none. Readers
parse only the features they need, so the image and the label read the same either way.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

IMAGE_KEY = "image"
LABEL_KEY = "label"
DAY_KEY = "day"


def encode_example(image: np.ndarray, label: int, day: str | None = None) -> bytes:
    """Serialises one decoded image (uint8, HxWxC), its class label and, for a record of a
    dated drop, its day."""
    feature = {
        IMAGE_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
        LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    }
    if day is not None:
        feature[DAY_KEY] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[day.encode()]))
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    # Map fields serialise in a per-process order unless asked to be deterministic, and the
    # shard files must be byte-identical across runs and worker processes.
    return example.SerializeToString(deterministic=True)


def feature_spec() -> dict[str, tf.io.FixedLenFeature]:
    """The parsing spec for `tf.io.parse_example`."""
    return {
        IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
        LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
    }


def day_spec() -> dict[str, tf.io.FixedLenFeature]:
    """The parsing spec of the day alone: b"" for a record without one."""
    return {DAY_KEY: tf.io.FixedLenFeature([], tf.string, default_value="")}


def parse_batch(serialized: tf.Tensor, image_shape: list[int]) -> tuple[tf.Tensor, tf.Tensor]:
    """Parses a batch of serialised examples into (uint8 images [B,H,W,C], int64 labels [B])."""
    parsed = tf.io.parse_example(serialized, feature_spec())
    images = tf.io.decode_raw(parsed[IMAGE_KEY], tf.uint8)
    images = tf.reshape(images, [-1, *image_shape])
    return images, parsed[LABEL_KEY]
