"""What is served: the export's signatures, inputs and outputs, its versions, a push request.

Every export format and every check of one (evaluate.serving's SavedModel and its in-process
check, evaluate.model_server's query through TF Serving's binary) speaks these names.

Both signatures return `probabilities` [batch, classes] float32, `class_ids` [batch] int64
(the arg max) and `class_names` [batch] string: `serving_default` takes `images`, a batch of raw
images in the model's own input dtype and shape; `serving_tf_example` takes `examples`, a batch
of serialised `tf.train.Example` with the shard set's image feature.

A version is the run's date and a two-digit sequence number as an integer (2026-01-31 ->
2026013100; a date retrained and blessed again -> 2026013101), so a backfilled night sorts below
the nights after it, a retrained date above the model it replaces, and TF Serving, which serves
the highest version, serves the newest.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import numpy as np
import tensorflow as tf
import tf_keras

from contract import layout, records
from evaluate.versions import version_for_date

SERVING_SIGNATURE = "serving_default"
EXAMPLE_SIGNATURE = "serving_tf_example"
IMAGES_INPUT = "images"
EXAMPLES_INPUT = "examples"
OUTPUTS = ("probabilities", "class_ids", "class_names")


@dataclasses.dataclass(frozen=True)
class PushRequest:
    """What to push and where.

    Attributes:
        model: the Keras model (blessed).
        model_sha256: the sha256 of its model file; recorded in the push marker.
        export_base: the folder holding one folder per served model name.
        model_name: the served model's name (a folder under export_base).
        date: the run's date, from which the version is derived.
        image_shape: the shard set's image shape (height, width, channels).
        class_names: the class names, by class index.
        serialized_examples: real eval records (serialised tf.Example) to check the export on.
        sequence: which push of the date this is (0 the first; a retrained date's is higher).
    """

    model: tf_keras.Model
    model_sha256: str
    export_base: str
    model_name: str
    date: str
    image_shape: list[int]
    class_names: list[str]
    serialized_examples: list[bytes]
    sequence: int = 0

    @property
    def version(self) -> int:
        return version_for_date(self.date, self.sequence)

    @property
    def model_dir(self) -> str:
        return layout.join(self.export_base, self.model_name)

    @property
    def version_dir(self) -> str:
        return layout.join(self.model_dir, str(self.version))


def model_input(model: tf_keras.Model, image_shape: list[int]) -> tuple[list[int | None], tf.DType]:
    """The shape (without the batch) and dtype of a model's image input.

    A functional or sequential model declares its input; a subclassed one may not, and then
    it takes what the train contract gives every model: float32 pixels of the shard set's shape.
    """
    inputs = getattr(model, "inputs", None)
    if inputs:
        return list(inputs[0].shape[1:]), tf.as_dtype(inputs[0].dtype)
    return list(image_shape), tf.float32


def signature_names() -> dict[str, dict[str, Any]]:
    """The export's signatures, their inputs and outputs, as push.json records them."""
    return {
        SERVING_SIGNATURE: {"inputs": [IMAGES_INPUT], "outputs": list(OUTPUTS)},
        EXAMPLE_SIGNATURE: {
            "inputs": [EXAMPLES_INPUT],
            "outputs": list(OUTPUTS),
            "features": {records.IMAGE_KEY: "raw uint8 bytes of one HxWxC image"},
        },
    }


def keras_predictions(model: tf_keras.Model, images: Any) -> np.ndarray:
    """The model's probabilities for one batch, as float32, through Keras's `predict`.

    That is a compiled function, as the export's signatures and evaluate's scoring are. An
    eager call runs unfused kernels instead, which under mixed_bfloat16 round intermediate
    results otherwise: up to about 0.006 in a probability on an AMX CPU.
    """
    return np.asarray(model.predict(images, batch_size=max(1, len(images)), verbose=0), np.float32)


class ExportFormat(Protocol):
    """How a push writes one version of the served model, and checks it before it is served.

    evaluate.serving's push stages the version in a folder TF Serving ignores, calls `export`
    and `verify` on it, writes the push marker and only then moves it into place. A format is
    registered by name in `evaluate.serving.FORMATS` and chosen with `[Evaluate] export_format`.

    Attributes:
        name: the format's name, as `export_format` gives it.
        last_files: on an object store, where a version folder cannot appear at once, the
            files copied last (after them only the push marker): what makes it loadable.
    """

    name: str
    last_files: tuple[str, ...]

    def export(self, request: PushRequest, version_dir: str) -> None:
        """Writes the request's model into `version_dir`."""
        ...

    def verify(self, request: PushRequest, version_dir: str) -> dict[str, Any]:
        """Checks what `export` wrote against the Keras model; the findings, for push.json.

        Raises:
            ValueError: the export does not predict what the model predicts (then it is not
                pushed).
        """
        ...
