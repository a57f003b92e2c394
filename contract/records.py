"""The record format of every shard: a tf.train.Example with raw image bytes and a label."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

IMAGE_KEY = "image"
LABEL_KEY = "label"


def encode_example(image: np.ndarray, label: int) -> bytes:
    """Serialises one decoded image (uint8, HxWxC) and its class label."""
    feature = {
        IMAGE_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
        LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    }
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


def parse_batch(serialized: tf.Tensor, image_shape: list[int]) -> tuple[tf.Tensor, tf.Tensor]:
    """Parses a batch of serialised examples into (uint8 images [B,H,W,C], int64 labels [B])."""
    parsed = tf.io.parse_example(serialized, feature_spec())
    images = tf.io.decode_raw(parsed[IMAGE_KEY], tf.uint8)
    images = tf.reshape(images, [-1, *image_shape])
    return images, parsed[LABEL_KEY]
