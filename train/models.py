"""The model registry: built-in architectures by short name, or a user's model function by import
path (`package.module:function`, train.user_model); each takes raw 0-255 pixels to softmax."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tf_keras as keras

from train import user_model
from train.checks import check_name
from train.config import ConfigError, TrainConfig
from train.user_model import InputSpec

Builder = Callable[[Sequence[int], int], keras.Model]


# Faster than Keras's 0.99: the moving statistics keep up within the first epoch.
BN_MOMENTUM = 0.9


def _probabilities(x: keras.KerasTensor, num_classes: int) -> keras.KerasTensor:
    """The softmax layer, in float32 under any dtype policy: a bfloat16 softmax would round
    the probabilities the loss and the metrics are computed from to 3 significant digits."""
    return keras.layers.Dense(
        num_classes, activation="softmax", name="probabilities", dtype="float32"
    )(x)


def _dense_head(x: keras.KerasTensor, num_classes: int) -> keras.KerasTensor:
    """The convolutional models' head: flatten, dense 128 with batch norm, dropout, softmax."""
    layers = keras.layers
    x = layers.Flatten()(x)
    x = layers.Dense(128, use_bias=False)(x)
    x = layers.BatchNormalization(momentum=BN_MOMENTUM)(x)
    x = layers.Activation("relu")(x)
    x = layers.Dropout(0.4)(x)
    return _probabilities(x, num_classes)


def _pooled_block(x: keras.KerasTensor, filters: int) -> keras.KerasTensor:
    """`cnn2`'s block: 3x3 convolution, max pooling, then batch norm and ReLU on a quarter of
    the pixels."""
    layers = keras.layers
    x = layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
    x = layers.MaxPooling2D()(x)
    x = layers.BatchNormalization(momentum=BN_MOMENTUM)(x)
    return layers.Activation("relu")(x)


def cnn(image_shape: Sequence[int], num_classes: int) -> keras.Model:
    """Two conv blocks with batch norm, pooling and dropout, then a dense head."""
    layers = keras.layers
    inputs = keras.Input(shape=tuple(image_shape), dtype="float32", name="image")
    x = layers.Rescaling(1.0 / 255.0)(inputs)
    for filters in (32, 64):
        x = layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization(momentum=BN_MOMENTUM)(x)
        x = layers.Activation("relu")(x)
        x = layers.MaxPooling2D()(x)
        x = layers.Dropout(0.2)(x)
    outputs = _dense_head(x, num_classes)
    return keras.Model(inputs, outputs, name="cnn")


def cnn2(image_shape: Sequence[int], num_classes: int) -> keras.Model:
    """`cnn`'s layers reordered for CPU speed: about 1.5x its training rate (BENCHMARKS.md).

    Each block pools right after its convolution, so batch norm and ReLU run on a quarter of
    the pixels, and dropout is only in the head (on-the-fly augmentation regularises the rest):
    on a CPU the elementwise work at full resolution, not the convolutions' arithmetic, took
    most of `cnn`'s step. Same weights as `cnn`.
    """
    layers = keras.layers
    inputs = keras.Input(shape=tuple(image_shape), dtype="float32", name="image")
    x = layers.Rescaling(1.0 / 255.0)(inputs)
    for filters in (32, 64):
        x = _pooled_block(x, filters)
    outputs = _dense_head(x, num_classes)
    return keras.Model(inputs, outputs, name="cnn2")


def cnn3(image_shape: Sequence[int], num_classes: int) -> keras.Model:
    """`cnn2` with a third block (128 filters on the 7x7 maps, pooled to 3x3) before the head.

    The third convolution adds as much arithmetic as the second at a quarter of its pixels,
    and the smaller map shrinks the head: fewer weights than `cnn` (242,602) for more depth.
    """
    layers = keras.layers
    inputs = keras.Input(shape=tuple(image_shape), dtype="float32", name="image")
    x = layers.Rescaling(1.0 / 255.0)(inputs)
    for filters in (32, 64, 128):
        x = _pooled_block(x, filters)
    outputs = _dense_head(x, num_classes)
    return keras.Model(inputs, outputs, name="cnn3")


def mlp(image_shape: Sequence[int], num_classes: int) -> keras.Model:
    """A small dense baseline, quick enough for tests."""
    layers = keras.layers
    inputs = keras.Input(shape=tuple(image_shape), dtype="float32", name="image")
    x = layers.Rescaling(1.0 / 255.0)(inputs)
    x = layers.Flatten()(x)
    x = layers.Dense(64, activation="relu")(x)
    x = layers.BatchNormalization(momentum=BN_MOMENTUM)(x)
    outputs = _probabilities(x, num_classes)
    return keras.Model(inputs, outputs, name="mlp")


def mirror_averaged(core: keras.Model) -> keras.Model:
    """`core` scored on each image and on its left-right mirror image, probabilities averaged.

    Test-time flips, for models trained on flipped images too. Stock layers only (the mirror
    is a fixed 0/1 matrix on the width axis), so model.keras loads with plain
    `tf_keras.models.load_model`. Call inside the strategy's scope; `core` keeps its weights.
    """
    layers = keras.layers
    if len(core.input_shape) != 4:
        shape = list(core.input_shape[1:])
        raise ConfigError(f"test-time flips need images of (height, width, channels), not {shape}")
    width = core.input_shape[2]
    inputs = keras.Input(shape=core.input_shape[1:], dtype="float32", name="image")
    mirror = layers.Dense(
        width, use_bias=False, kernel_initializer="zeros", trainable=False, name="mirror"
    )  # zeros: draws no random numbers, so training is the same with or without it
    # Dense acts on the last axis: move width there and back.
    mirrored = layers.Permute((1, 3, 2))(mirror(layers.Permute((1, 3, 2))(inputs)))
    mirror.set_weights([np.eye(width, dtype=np.float32)[::-1]])
    outputs = layers.Average(name="mean_probabilities", dtype="float32")(
        [core(inputs), core(mirrored)]
    )
    return keras.Model(inputs, outputs, name=f"{core.name}_mirror_averaged")


def for_inference(core: keras.Model, test_time_augment: str) -> keras.Model:
    """The model validated each epoch and exported: `core` itself, or with test-time flips."""
    return mirror_averaged(core) if test_time_augment == "flip" else core


MODELS: dict[str, Builder] = {"cnn": cnn, "cnn2": cnn2, "cnn3": cnn3, "mlp": mlp}


def build(
    name: str,
    image_shape: Sequence[int],
    num_classes: int,
    precision: str = "float32",
    hparams: dict[str, Any] | None = None,
    class_names: Sequence[str] = (),
) -> keras.Model:
    """Builds the named model, or calls the function `name` imports, under the dtype policy
    `precision` (call inside `strategy.scope()`). The policy is Keras's global one: it is set
    here for every model.

    Raises:
        ConfigError: an unknown name, or a function by import path that fails or returns no
            model of the right shapes.
    """
    check_name(name, hparams)
    keras.mixed_precision.set_global_policy(precision)
    if user_model.is_import_path(name):
        names = tuple(class_names) or tuple(str(i) for i in range(num_classes))
        spec = InputSpec(tuple(image_shape), user_model.INPUT_DTYPE, num_classes, names)
        return user_model.build(name, spec, hparams or {})
    return MODELS[name](image_shape, num_classes)


def is_built_in(name: str) -> bool:
    """Whether `name` is one of the registry's models: no user code in its model, loss or
    optimizer (those come from a model by import path and its hooks)."""
    return name in MODELS


def check_builds(config: TrainConfig, shard_manifest: dict[str, Any]) -> None:
    """Builds a model by import path once, with its optimizer and loss hooks, and drops them,
    so that a function that fails or returns something else is found before any worker starts.

    Raises:
        ConfigError: see `build`.
    """
    check_name(config.model, config.hparams)
    if not user_model.is_import_path(config.model):
        return
    try:
        build_for_run(config, shard_manifest)
        optimizer(config, config.learning_rate)
        loss(config)
    finally:
        keras.backend.clear_session()
        keras.mixed_precision.set_global_policy("float32")


def build_for_run(config: TrainConfig, shard_manifest: dict[str, Any]) -> keras.Model:
    """The run's model on the shard set's input spec (call inside `strategy.scope()`)."""
    spec = InputSpec.from_manifest(shard_manifest)
    return build(
        config.model,
        spec.shape,
        spec.num_classes,
        config.precision,
        config.hparams,
        spec.class_names,
    )


def optimizer(config: TrainConfig, learning_rate: Any) -> keras.optimizers.Optimizer | None:
    """The optimizer of a model by import path's `build_optimizer` hook; None for the default."""
    if not user_model.is_import_path(config.model):
        return None
    return user_model.optimizer(config.model, learning_rate, config.hparams)


def loss(config: TrainConfig) -> Any | None:
    """The loss of a model by import path's `build_loss` hook; None for the default."""
    if not user_model.is_import_path(config.model):
        return None
    return user_model.loss(config.model, config.hparams)
