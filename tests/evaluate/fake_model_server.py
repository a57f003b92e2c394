"""A stand-in for `tensorflow_model_server` in tests, where the real binary is not installed.

`python -m tests.evaluate.fake_model_server --rest_api_port=P --model_name=N
--model_base_path=DIR` loads the highest numbered version under DIR with tf.saved_model.load
and answers the two REST calls evaluate.model_server makes, in TF Serving's JSON formats:
`GET /v1/models/N` (model_version_status) and `POST /v1/models/N/versions/V:predict` with
columnar `inputs` and `signature_name` (strings as `{"b64": ...}`), answering `outputs`.
`FAKE_MODEL_SERVER_OFFSET` adds a number to every probability, to stand for a server that
disagrees with the model.
"""

from __future__ import annotations

import argparse
import base64
import http.server
import json
import os
from typing import Any

import numpy as np
import tensorflow as tf


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and "b64" in value:
        return base64.b64decode(value["b64"])
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _encode(array: np.ndarray) -> Any:
    if array.dtype == object:
        return [v.decode() for v in array.tolist()]
    return array.tolist()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rest_api_port", type=int, required=True)
    parser.add_argument("--model_name", required=True)
    parser.add_argument("--model_base_path", required=True)
    args, _ = parser.parse_known_args()  # --port and the rest, as the real server takes them
    versions = [int(n) for n in os.listdir(args.model_base_path) if n.isdigit()]
    version = max(versions)
    loaded = tf.saved_model.load(os.path.join(args.model_base_path, str(version)))
    offset = float(os.environ.get("FAKE_MODEL_SERVER_OFFSET", "0"))
    prefix = f"/v1/models/{args.model_name}"

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path != prefix:
                self._answer(404, {"error": "no such model"})
                return
            status = [{"version": str(version), "state": "AVAILABLE"}]
            self._answer(200, {"model_version_status": status})

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            if self.path != f"{prefix}/versions/{version}:predict":
                self._answer(404, {"error": "no such version"})
                return
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            signature = loaded.signatures[request["signature_name"]]
            spec = signature.structured_input_signature[1]
            inputs = {
                name: tf.constant(_decode(value), dtype=spec[name].dtype)
                for name, value in request["inputs"].items()
            }
            outputs = {k: v.numpy() for k, v in signature(**inputs).items()}
            outputs["probabilities"] = outputs["probabilities"] + offset
            self._answer(200, {"outputs": {k: _encode(v) for k, v in outputs.items()}})

        def log_message(self, *_: Any) -> None:
            pass

    http.server.HTTPServer(("127.0.0.1", args.rest_api_port), Handler).serve_forever()


if __name__ == "__main__":
    main()
