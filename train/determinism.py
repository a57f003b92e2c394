"""One seed for everything random in training, and TensorFlow's deterministic ops.

Weight initialisation draws from the seeded global generators; dropout draws from a
`tf.random.Generator` per layer whose state is saved with the backup (`random_generators`);
the input order is a stateless function of (seed, worker, epoch) (`train.data`). So two runs
with the same seed, worker count and machine are bit-identical, and so is a resumed one.
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras


def make_deterministic(seed: int) -> None:
    """Seeds Python, NumPy and TensorFlow and turns on op determinism; call before any model."""
    # Layers then draw from a tf.random.Generator, whose state is a variable that can be
    # checkpointed, instead of stateful ops whose state dies with the process.
    keras.backend.experimental.enable_tf_random_generator()
    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()


def random_generators(model: keras.Model) -> dict[str, tf.random.Generator]:
    """The random generators of the model's layers (dropout's), by layer name, for the backup.

    A functional model's checkpoint only tracks layers with weights, so a dropout layer's
    generator state would otherwise be lost on resume.
    """
    found = {}
    for layer in model.submodules:
        generator = getattr(getattr(layer, "_random_generator", None), "_generator", None)
        if isinstance(generator, tf.random.Generator):
            found[layer.name] = generator
    return found
