"""Decoding source images to the shard format's uint8 HxWxC pixels, one size for the whole set."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from preprocess.errors import BadInputError


def decode(encoded: bytes, channels: int, source: str) -> np.ndarray:
    """PNG, JPEG, GIF (first frame) or BMP bytes as uint8 HxWxC with `channels` channels
    (0: the file's own), through tf.io.decode_image, the decoder TFDS's Image feature uses.

    Raises:
        BadInputError: the bytes are not an image TensorFlow decodes, naming `source`.
    """
    try:
        image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
    except (tf.errors.InvalidArgumentError, ValueError) as e:
        reason = " ".join(getattr(e, "message", str(e)).split())[:200]
        raise BadInputError(f"cannot decode the image of {source}: {reason}") from None
    if image.dtype != tf.uint8:  # 16-bit PNG
        image = tf.image.convert_image_dtype(image, tf.uint8, saturate=True)
    return image.numpy()


class ImageShaper:
    """Brings every image to the set's shape: resized to `resize`, or checked against the
    reference image (the first of the train split) when images keep their size.

    Args:
        reference: names the reference image in error lines.
        reference_shape: its [H, W, C].
        resize: (height, width) every image is resized to, or None.
    """

    def __init__(self, reference: str, reference_shape: list[int], resize: tuple[int, int] | None):
        self.reference = reference
        self.reference_shape = list(reference_shape)
        self.resize = resize

    @property
    def shape(self) -> list[int]:
        """[H, W, C] of every image the shaper returns."""
        if self.resize is None:
            return self.reference_shape
        return [*self.resize, self.reference_shape[2]]

    def conform(self, image: np.ndarray, source: str) -> np.ndarray:
        """`image` at the set's shape.

        Raises:
            BadInputError: its size differs from the reference image's and there is no resize,
                naming both.
        """
        height, width = image.shape[:2]
        if self.resize is None:
            if [height, width] != self.reference_shape[:2]:
                h, w = self.reference_shape[:2]
                raise BadInputError(
                    f"images differ in size: {self.reference} is {h}x{w}, {source} is "
                    f"{height}x{width}: pass --resize HxW (e.g. --resize {h}x{w}) to bring "
                    "every image to one size"
                )
            return image
        if (height, width) == self.resize:
            return image
        resized = tf.image.resize(image, self.resize, method="bilinear", antialias=True)
        return np.clip(np.round(resized.numpy()), 0, 255).astype(np.uint8)
