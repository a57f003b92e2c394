"""An example model module for `--Train-model examples.my_model:build_model` (docs/extending.md).

The pipeline calls `build_model(input_spec, hparams)` and, when they are defined, the hooks
`build_optimizer(learning_rate, hparams)` and `build_loss(hparams)` of the same module.
"""

from __future__ import annotations

from typing import Any

import tf_keras as keras


@keras.saving.register_keras_serializable(package="my_model")
class CentredPixels(keras.layers.Layer):
    """Maps raw 0-255 pixels to [-1, 1]: a custom layer, saved in model.keras by name, that
    the evaluate stage loads by importing this module (so keep it importable there too)."""

    def call(self, images: Any) -> Any:
        return images / 127.5 - 1.0


def build_model(input_spec: Any, hparams: dict[str, Any]) -> keras.Model:
    """A small convolutional net; `hparams`: width (filters, default 16), dropout (0.1).

    Args:
        input_spec: shape (height, width, channels), dtype, num_classes and class_names of
            the shard set the model trains on.
        hparams: the run's `--Train-hparams` (a dict).

    Returns:
        An uncompiled model from raw pixels to class probabilities.
    """
    width = int(hparams.get("width", 16))
    layers = keras.layers
    inputs = keras.Input(shape=input_spec.shape, dtype=input_spec.dtype, name="image")
    x = CentredPixels(name="centred_pixels")(inputs)
    x = layers.Conv2D(width, 3, padding="same", activation="relu", name="shape_features")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Flatten()(x)
    x = layers.Dropout(float(hparams.get("dropout", 0.1)))(x)
    # float32 probabilities under any precision policy: the loss and the metrics read them.
    outputs = layers.Dense(
        input_spec.num_classes, activation="softmax", dtype="float32", name="probabilities"
    )(x)
    return keras.Model(inputs, outputs, name="my_model")


def build_optimizer(learning_rate: Any, hparams: dict[str, Any]) -> keras.optimizers.Optimizer:
    """Adam with weight decay (hparams: weight_decay, default 1e-4); `learning_rate` is the
    run's rate or schedule, passed on so that --Train-lr-schedule still applies."""
    return keras.optimizers.AdamW(
        learning_rate=learning_rate, weight_decay=float(hparams.get("weight_decay", 1e-4))
    )


def build_loss(hparams: dict[str, Any]) -> keras.losses.Loss:
    """Cross-entropy of the integer labels against the probabilities."""
    return keras.losses.SparseCategoricalCrossentropy()
