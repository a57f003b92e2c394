"""Pushing a blessed model to serving, in TF Serving's `<base>/<name>/<version>/`.

The push (staging, the marker, the move into place, reruns) is the same for every export
format (evaluate.signatures.ExportFormat); the one registered here, and the default, is a
SavedModel for TF Serving (`SAVED_MODEL`).

The export works on any single-input Keras model. It holds two signatures:

- `serving_default` (`SERVING_SIGNATURE`): input `images`, a batch of raw images in the
  model's own input dtype and shape (float32 pixels 0-255 for the built-in models);
- `serving_tf_example` (`EXAMPLE_SIGNATURE`): input `examples`, a batch of serialised
  `tf.train.Example` with the shard set's image feature (contract.records: `image`, the raw
  uint8 bytes of one HxWxC image; `label` may be there and is ignored), as TFX exports do.

Both return `probabilities` [batch, classes] float32, `class_ids` [batch] int64 (the arg max)
and `class_names` [batch] string. The version is the run's date and a two-digit sequence
number as an integer (2026-01-31 -> 2026013100; a date retrained and blessed again ->
2026013101), so a backfilled night sorts below the nights after it, a retrained date above the
model it replaces, and TF Serving, which serves the highest version, serves the newest.

A version is written into a hidden temporary folder beside its final place
(`<name>/.tmp-<version>-<id>/<version>/`, which TF Serving ignores), loaded back with
`tf.saved_model.load`, called on real eval examples through both signatures (predictions equal
the Keras model's within `TOLERANCE`), queried through `tensorflow_model_server` when that is on
PATH, and only then moved into place. `PUSH_MARKER` inside it (`assets.extra/`, where TF
Serving keeps files that are not the model) is written last and names the Keras model's
sha256: a version folder without it is an unfinished push and is redone; one naming the same
model is left as it is (a rerun is a no-op). Locally the move is one rename; on gs://, where a
folder rename is a copy, the files are copied with `saved_model.pb` and then the marker last,
so a server polling the folder does not find a loadable model before its variables.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras

from contract import atomic, layout, records, storage
from evaluate import model_server
from evaluate.signatures import (
    EXAMPLE_SIGNATURE,
    EXAMPLES_INPUT,
    IMAGES_INPUT,
    SERVING_SIGNATURE,
    ExportFormat,
    PushRequest,
    keras_predictions,
    model_input,
    signature_names,
)
from evaluate.versions import PUSH_MARKER, SAVED_MODEL_PB, copy_version, read_marker

logger = logging.getLogger(__name__)

# Largest difference allowed between the export's and the Keras model's probabilities.
TOLERANCE = 1e-5


class ExportError(Exception):
    """The export could not be written or does not predict what the Keras model predicts."""


class ExportBaseError(ExportError):
    """The export base cannot hold exports (it is a file)."""


def check_export_base(export_base: str) -> None:
    """Refuses an export base that exists and is not a folder, before any work is done.

    Raises:
        ExportBaseError: naming the path.
    """
    if tf.io.gfile.exists(export_base) and not tf.io.gfile.isdir(export_base):
        raise ExportBaseError(
            f"export base {export_base} is a file, not a folder: pass an export base folder "
            "(default <output_root>/serving) or move the file away"
        )


class _Serving(tf.Module):
    """The exported object: the model's variables and the two signature functions.

    The Keras model is only closed over, never an attribute: an attribute would be saved as a
    Keras object, layer by layer, which is slow and fails for layers Keras cannot serialise.
    The variables are tracked here, so the SavedModel holds them.
    """

    def __init__(self, model: tf_keras.Model, image_shape: list[int], class_names: list[str]):
        super().__init__(name="serving")
        self.model_variables = list(model.variables)
        self.class_names = tf.constant(class_names)
        input_shape, input_dtype = model_input(model, image_shape)

        def outputs(images: tf.Tensor) -> dict[str, tf.Tensor]:
            probabilities = tf.cast(model(images, training=False), tf.float32)
            class_ids = tf.argmax(probabilities, axis=-1)
            return {
                "probabilities": probabilities,
                "class_ids": class_ids,
                "class_names": tf.gather(self.class_names, class_ids),
            }

        def serve_examples(examples: tf.Tensor) -> dict[str, tf.Tensor]:
            # Only the image is parsed: a request without a label is served too.
            spec = {records.IMAGE_KEY: records.feature_spec()[records.IMAGE_KEY]}
            parsed = tf.io.parse_example(examples, spec)
            pixels = tf.io.decode_raw(parsed[records.IMAGE_KEY], tf.uint8)
            return outputs(tf.cast(tf.reshape(pixels, [-1, *image_shape]), input_dtype))

        self.serve_images = tf.function(
            outputs,
            input_signature=[tf.TensorSpec([None, *input_shape], input_dtype, name=IMAGES_INPUT)],
        )
        self.serve_examples = tf.function(
            serve_examples,
            input_signature=[tf.TensorSpec([None], tf.string, name=EXAMPLES_INPUT)],
        )


def export(
    model: tf_keras.Model, image_shape: list[int], class_names: list[str], export_dir: str
) -> None:
    """Writes `model` as a SavedModel with both serving signatures into `export_dir`."""
    module = _Serving(model, image_shape, class_names)
    tf.saved_model.save(
        module,
        export_dir,
        signatures={
            SERVING_SIGNATURE: module.serve_images,
            EXAMPLE_SIGNATURE: module.serve_examples,
        },
    )


def decode_examples(serialized: list[bytes], image_shape: list[int]) -> np.ndarray:
    """The images of serialised records as uint8 [N, H, W, C]."""
    images, _ = records.parse_batch(tf.constant(serialized), image_shape)
    return np.asarray(images.numpy())


def _max_difference(expected: np.ndarray, outputs: dict[str, tf.Tensor], what: str) -> float:
    got = outputs["probabilities"].numpy()
    if got.shape != expected.shape:
        raise ExportError(
            f"{what} returned probabilities of shape {got.shape}, not {expected.shape}"
        )
    difference = float(np.max(np.abs(got - expected))) if got.size else 0.0
    if not difference <= TOLERANCE:
        raise ExportError(
            f"{what} predicts up to {difference:.3g} away from the Keras model "
            f"(allowed {TOLERANCE:g}); the export is not pushed"
        )
    if not np.array_equal(outputs["class_ids"].numpy(), expected.argmax(axis=1)):
        raise ExportError(f"{what} returned class_ids that are not the arg max of probabilities")
    return difference


def verify(request: PushRequest, export_dir: str) -> dict[str, Any]:
    """Loads the export back and checks both signatures against the Keras model.

    Returns:
        {"examples", "max_abs_difference": {signature: value}, "tolerance"}.

    Raises:
        ExportError: a signature is missing or predicts otherwise than the Keras model.
    """
    images = decode_examples(request.serialized_examples, request.image_shape)
    _, dtype = model_input(request.model, request.image_shape)
    model_images = tf.constant(images.astype(dtype.as_numpy_dtype))
    expected = keras_predictions(request.model, model_images)
    loaded = tf.saved_model.load(export_dir)
    missing = {SERVING_SIGNATURE, EXAMPLE_SIGNATURE} - set(loaded.signatures)
    if missing:
        raise ExportError(f"the export in {export_dir} lacks signature(s) {sorted(missing)}")
    differences = {
        SERVING_SIGNATURE: _max_difference(
            expected,
            loaded.signatures[SERVING_SIGNATURE](**{IMAGES_INPUT: model_images}),
            f"signature {SERVING_SIGNATURE}",
        ),
        EXAMPLE_SIGNATURE: _max_difference(
            expected,
            loaded.signatures[EXAMPLE_SIGNATURE](
                **{EXAMPLES_INPUT: tf.constant(request.serialized_examples)}
            ),
            f"signature {EXAMPLE_SIGNATURE}",
        ),
    }
    return {
        "examples": len(request.serialized_examples),
        "max_abs_difference": differences,
        "tolerance": TOLERANCE,
    }


def _marker(request: PushRequest) -> dict[str, Any]:
    return {
        "model_sha256": request.model_sha256,
        "date": request.date,
        "version": request.version,
        "signatures": signature_names(),
    }


def _move_into_place(staged: str, final: str, last_files: tuple[str, ...]) -> None:
    """Moves a finished version folder into place; the marker appears last.

    A local folder moves with one rename, its files and folders flushed to the disk before it
    and the served folder's entry after it, so a power loss never leaves a version folder
    whose files are empty. On gs:// the files are copied (`copy_version`).
    """
    if not storage.is_remote(final):
        atomic.sync_tree(staged)
        tf.io.gfile.rename(staged, final)
        atomic.sync_folder(final.rsplit("/", 1)[0])
        return
    copy_version(staged, final, last_files)


def _remove(path: str) -> None:
    if tf.io.gfile.exists(path):
        tf.io.gfile.rmtree(path)


def _remove_stale_staging(request: PushRequest) -> None:
    """Removes what a killed push of this version left (one run of a date at a time, so no
    other push of it is under way)."""
    if not tf.io.gfile.isdir(request.model_dir):
        return
    prefix = f".tmp-{request.version}-"
    for name in tf.io.gfile.listdir(request.model_dir):
        if name.startswith(prefix):
            logger.info("removing %s, left by an interrupted push", name.rstrip("/"))
            _remove(layout.join(request.model_dir, name.rstrip("/")))


class SavedModelFormat:
    """A SavedModel with both serving signatures, checked in process and, where its binary is
    installed, through tensorflow_model_server."""

    name: str = "saved_model"
    last_files: tuple[str, ...] = (SAVED_MODEL_PB,)

    def export(self, request: PushRequest, version_dir: str) -> None:
        export(request.model, request.image_shape, request.class_names, version_dir)

    def verify(self, request: PushRequest, version_dir: str) -> dict[str, Any]:
        verification = verify(request, version_dir)
        try:
            verification["model_server"] = model_server.check(
                version_dir.rsplit("/", 1)[0],  # the base path holding the version folder
                request,
                decode_examples(request.serialized_examples, request.image_shape),
            )
        except model_server.ModelServerError as e:
            raise ExportError(f"{e}; the export is not pushed") from e
        return verification


SAVED_MODEL = SavedModelFormat()
# The export formats `[Evaluate] export_format` may name (evaluate.config.EXPORT_FORMATS).
FORMATS: dict[str, ExportFormat] = {SAVED_MODEL.name: SAVED_MODEL}


def push(request: PushRequest, export_format: ExportFormat = SAVED_MODEL) -> dict[str, Any]:
    """Exports, verifies and moves the model into `<export_base>/<model_name>/<version>/`.

    Returns:
        The push document (push.json): `pushed`, `status` ("pushed" or "already pushed"),
        `path`, `version`, `model_name`, `signatures`, the verification and the timings.

    Raises:
        ExportBaseError: the export base is a file.
        ExportError: the version folder holds another model, or the export does not predict
            what the Keras model predicts (nothing is moved into place then).
    """
    check_export_base(request.export_base)
    final = request.version_dir
    document: dict[str, Any] = {
        "pushed": True,
        "path": final,
        "version": request.version,
        "model_name": request.model_name,
        "export_base": request.export_base,
        "model_sha256": request.model_sha256,
        "signatures": signature_names(),
        "format": export_format.name,
    }
    marker = read_marker(final) if tf.io.gfile.exists(final) else None
    if marker is not None:
        if marker.get("model_sha256") != request.model_sha256:
            raise ExportError(
                f"serving version {final} already holds another model (sha256 "
                f"{str(marker.get('model_sha256'))[:16]}…, not {request.model_sha256[:16]}…): "
                "TF Serving does not reload a version in place; rerun the evaluation, which "
                "pushes this model as the date's next version"
            )
        logger.info("serving version %s already holds this model: nothing to push", final)
        return document | {"status": "already pushed"}
    if tf.io.gfile.exists(final):
        logger.warning("serving version %s has no push marker (an unfinished push): redoing", final)
        _remove(final)

    _remove_stale_staging(request)
    staging_base = layout.join(request.model_dir, f".tmp-{request.version}-{uuid.uuid4().hex}")
    staged = layout.join(staging_base, str(request.version))
    try:
        started = time.perf_counter()
        export_format.export(request, staged)
        export_seconds = time.perf_counter() - started
        started = time.perf_counter()
        try:
            verification = export_format.verify(request, staged)
        except ExportError:
            raise
        except ValueError as e:
            raise ExportError(f"{e}; the export is not pushed") from e
        verify_seconds = time.perf_counter() - started
        marker_path = layout.join(staged, PUSH_MARKER)
        tf.io.gfile.makedirs(marker_path.rsplit("/", 1)[0])
        atomic.write_json_atomic(marker_path, _marker(request))
        _move_into_place(staged, final, export_format.last_files)
    finally:
        _remove(staging_base)
    logger.info(
        "pushed version %d to %s (export %.1f s, verification %.1f s)",
        request.version,
        final,
        export_seconds,
        verify_seconds,
    )
    return document | {
        "status": "pushed",
        "verification": verification,
        "export_seconds": round(export_seconds, 3),
        "verify_seconds": round(verify_seconds, 3),
    }
