"""A load-and-query check of an export through TF Serving's own binary, when it is installed.

`check(base_path, request, images)` starts `tensorflow_model_server` on the staged export
(`base_path/<version>/`, loopback ports only), waits until the version is AVAILABLE, queries
both signatures through the REST API and compares the probabilities with the Keras model's.
Without the binary on PATH (or for a gs:// export, which the server would need cloud
credentials for) it says why it did not run, and the in-process check (evaluate.serving.verify)
is the one that stands.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

import numpy as np

from contract import processes, storage
from evaluate import signatures
from evaluate.signatures import PushRequest

BINARY = "tensorflow_model_server"
# Enough to see both signatures answer; the in-process check covers every verified example.
QUERY_EXAMPLES = 32
STARTUP_TIMEOUT_SECONDS = 120.0


class ModelServerError(Exception):
    """tensorflow_model_server did not load the export or answered otherwise than Keras."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(url: str, body: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as response:
        return json.loads(response.read())


def _wait_available(server: subprocess.Popen, status_url: str, version: int, log_path: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise ModelServerError(
                f"{BINARY} exited with code {server.returncode} before serving the export "
                f"(its log: {log_path})"
            )
        try:
            states = _request(status_url, timeout=5.0).get("model_version_status", [])
        except (urllib.error.URLError, OSError, ValueError):
            states = []
        for state in states:
            if str(state.get("version")) == str(version) and state.get("state") == "AVAILABLE":
                return
        time.sleep(0.5)
    raise ModelServerError(
        f"{BINARY} did not serve version {version} within {STARTUP_TIMEOUT_SECONDS:.0f} s "
        f"(its log: {log_path})"
    )


def _compare(expected: np.ndarray, answer: Any, signature: str) -> float:
    try:
        got = np.asarray(answer["outputs"]["probabilities"], np.float32)
    except (KeyError, TypeError) as e:
        raise ModelServerError(f"{BINARY} answered {signature} without probabilities") from e
    if got.shape != expected.shape:
        raise ModelServerError(
            f"{BINARY} answered {signature} with shape {got.shape}, not {expected.shape}"
        )
    difference = float(np.max(np.abs(got - expected)))
    # JSON carries float32 values as decimal text: allow its rounding on top of the tolerance.
    if difference > 2e-5:
        raise ModelServerError(
            f"{BINARY} answered {signature} up to {difference:.3g} away from the Keras model"
        )
    return difference


def check(base_path: str, request: PushRequest, images: np.ndarray) -> dict[str, Any]:
    """Serves `base_path` (holding `<version>/`) with tensorflow_model_server and queries it.

    Args:
        base_path: the staged model base path (a folder holding the version folder).
        request: the push request (model, name, version, examples).
        images: the decoded images of `request.serialized_examples`, uint8 [N, H, W, C].

    Returns:
        {"ran": False, "reason": ...} when the binary is not there, else
        {"ran": True, "examples", "max_abs_difference": {signature: value}}.

    Raises:
        ModelServerError: the server failed to load the export or answered otherwise.
    """
    binary = shutil.which(BINARY)
    if binary is None:
        return {"ran": False, "reason": f"{BINARY} is not on PATH: the in-process check stands"}
    if storage.is_remote(base_path):
        return {
            "ran": False,
            "reason": f"{BINARY} is run on local exports only: the in-process check stands",
        }
    count = min(QUERY_EXAMPLES, len(request.serialized_examples))
    _, dtype = signatures.model_input(request.model, request.image_shape)
    model_input = images[:count].astype(dtype.as_numpy_dtype)
    expected = signatures.keras_predictions(request.model, model_input)
    rest_port = _free_port()
    name, version = request.model_name, request.version
    base_url = f"http://127.0.0.1:{rest_port}/v1/models/{name}"
    with tempfile.NamedTemporaryFile("wb", suffix=".log", delete=False) as log:
        log_path = log.name
        server = subprocess.Popen(
            [
                binary,
                f"--port={_free_port()}",
                f"--rest_api_port={rest_port}",
                "--rest_api_num_threads=2",
                f"--model_name={name}",
                f"--model_base_path={os.path.abspath(base_path)}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=processes.signal_when_parent_dies(signal.SIGKILL),  # noqa: PLW1509
        )
    try:
        _wait_available(server, base_url, version, log_path)
        predict = f"{base_url}/versions/{version}:predict"
        differences = {
            signatures.SERVING_SIGNATURE: _compare(
                expected,
                _request(
                    predict,
                    {
                        "signature_name": signatures.SERVING_SIGNATURE,
                        "inputs": {signatures.IMAGES_INPUT: model_input.tolist()},
                    },
                ),
                signatures.SERVING_SIGNATURE,
            ),
            signatures.EXAMPLE_SIGNATURE: _compare(
                expected,
                _request(
                    predict,
                    {
                        "signature_name": signatures.EXAMPLE_SIGNATURE,
                        "inputs": {
                            signatures.EXAMPLES_INPUT: [
                                {"b64": base64.b64encode(s).decode("ascii")}
                                for s in request.serialized_examples[:count]
                            ]
                        },
                    },
                ),
                signatures.EXAMPLE_SIGNATURE,
            ),
        }
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise ModelServerError(f"querying {BINARY} failed: {e} (its log: {log_path})") from e
    finally:
        server.kill()
        server.wait()
    os.remove(log_path)
    return {"ran": True, "examples": count, "max_abs_difference": differences}
