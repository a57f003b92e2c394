"""`tf.io.gfile` (and `tf.errors`), with TensorFlow imported on first use, not on import.

Luigi's process imports the pipeline's modules to parse a command line, refuse a bad
parameter or print `--help`, and none of that needs TensorFlow, whose import takes seconds.
The modules it imports reach files through `gfile.exists(...)` and the like from here; the
stages import TensorFlow as usual.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    import tensorflow as tf

    if name == "errors":
        return tf.errors
    return getattr(tf.io.gfile, name)
