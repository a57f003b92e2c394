"""A local stand-in for Google Cloud Storage: `python -m tests.gcs_emulator --workdir DIR`.

Serves, on free loopback ports, until SIGTERM:
- gcp-storage-emulator (the GCS JSON and XML APIs, one request at a time), which Beam's and
  google-cloud-storage's clients reach through `STORAGE_EMULATOR_HOST`;
- a TLS-terminating HTTPS proxy for TensorFlow, whose gs:// filesystem always talks to
  `storage.googleapis.com` / `www.googleapis.com`: its libcurl honours `HTTPS_PROXY` and
  `CURL_CA_BUNDLE`, so the proxy answers CONNECT with a certificate made here for those hosts
  and forwards each request to the emulator. It de-chunks request bodies (TensorFlow sends a
  Content-Length and chunked framing together; forwarded raw, checkpoints come back corrupt),
  sets Host to the emulator, and points resumable-upload locations back at the Google host;
- through the same proxy, Google's OAuth token endpoint handing out a dummy token: with
  `GOOGLE_APPLICATION_CREDENTIALS` naming a dummy authorized-user file, google-auth (and so
  Beam) finds credentials at once instead of retrying for ~20 s per process, and refreshes
  them here (`REQUESTS_CA_BUNDLE` trusts the proxy's certificate).

It prints one JSON line with the environment a client process needs (`env`) once it serves.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import ipaddress
import json
import os
import signal
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TOKEN_HOST = "oauth2.googleapis.com"
GOOGLE_HOSTS = ("storage.googleapis.com", "www.googleapis.com", TOKEN_HOST)
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "host",
    "content-length",
    "expect",  # the proxy answers 100-continue itself and forwards the whole body
}


def patch_emulator() -> None:
    """An empty upload (how TensorFlow writes a folder marker) reads as b'', not None; an
    upload with `ifGenerationMatch` is refused with 412 unless the object is at that
    generation (0: absent), as GCS does."""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import objects

    read_data = server._read_data

    def read_data_allowing_empty(request_handler: Any, query: dict) -> Any:
        data = read_data(request_handler, query)
        if data is None and query.get("uploadType") == ["media"]:
            return b""
        return data

    server._read_data = read_data_allowing_empty
    _keep_in_memory_metadata_in_memory()
    # The routing table holds the handler functions themselves.
    for _, handlers in server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler is objects.insert:
                handlers[method] = _honour_if_generation_match(handler)


def _keep_in_memory_metadata_in_memory() -> None:
    """The emulator writes every object's metadata out as one JSON file after each change,
    for a restarted emulator to read back; an in-memory one is never restarted, and the
    rewrite made each write cost as much as all the objects already stored."""
    from gcp_storage_emulator.storage import Storage

    write_config = Storage._write_config_to_file

    def write_config_unless_in_memory(self: Any) -> None:
        if not self._use_memory_fs:
            write_config(self)

    Storage._write_config_to_file = write_config_unless_in_memory


def _honour_if_generation_match(insert: Any) -> Any:
    """`insert` refusing an upload whose ifGenerationMatch is not the object's generation.

    The emulator serves one request at a time, so the check and the write are one step.
    """
    from http import HTTPStatus

    from gcp_storage_emulator.exceptions import NotFound

    def checked(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        wanted = request.query.get("ifGenerationMatch")
        if not wanted:
            return insert(request, response, storage, *args, **kwargs)
        name = request.query.get("name", [None])[0]
        if name is None and isinstance(request.data, dict):
            name = (request.data.get("meta") or request.data).get("name")
        try:
            current = int(storage.get_file_obj(request.params["bucket_name"], name)["generation"])
        except NotFound:
            current = 0
        if current != int(wanted[0]):
            response.status = HTTPStatus.PRECONDITION_FAILED
            reason = {"reason": "conditionNotMet", "message": "Precondition Failed"}
            response.json(
                {"error": {"code": 412, "message": "Precondition Failed", "errors": [reason]}}
            )
            return None
        return insert(request, response, storage, *args, **kwargs)

    return checked


def write_certificate(workdir: str) -> tuple[str, str]:
    """A self-signed certificate for the Google hosts; returns (cert file, key file)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GOOGLE_HOSTS[0])])
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = [x509.DNSName(h) for h in GOOGLE_HOSTS]
    names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path = os.path.join(workdir, "proxy-cert.pem")
    key_path = os.path.join(workdir, "proxy-key.pem")
    with open(cert_path, "wb") as f:
        f.write(certificate.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
    return cert_path, key_path


def _read_request(stream: Any) -> tuple[str, str, list[tuple[str, str]], bytes] | None:
    """One HTTP request from `stream`: (method, target, headers, de-chunked body)."""
    line = stream.readline()
    if not line:
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    headers = []
    while True:
        raw = stream.readline().decode("latin-1")
        if raw in ("\r\n", "\n", ""):
            break
        key, _, value = raw.partition(":")
        headers.append((key.strip(), value.strip()))
    lower = {k.lower(): v for k, v in headers}
    if lower.get("expect", "").lower() == "100-continue" and stream.writable():
        # What GCS answers; without it curl (TensorFlow's gs://) waits 1 s before each body.
        stream.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        stream.flush()
    if "chunked" in lower.get("transfer-encoding", "").lower():
        body = b""
        while True:
            size = int(stream.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while stream.readline() not in (b"\r\n", b"\n", b""):
                    pass
                break
            body += stream.read(size)
            stream.readline()
    else:
        body = stream.read(int(lower.get("content-length", "0") or 0))
    return method, target, headers, body


class _ProxyHandler(socketserver.StreamRequestHandler):
    server: _ProxyServer
    # TCP_NODELAY: with Nagle's algorithm each answer waited for the client's delayed
    # acknowledgement of the one before, 40 ms a request (a tiny FullRun took 2 minutes).
    disable_nagle_algorithm = True

    def handle(self) -> None:
        request = _read_request(self.rfile)
        if request is None:
            return
        method, target, _, _ = request
        if method == "CONNECT":
            host = target.split(":")[0]
            self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self.wfile.flush()
            tls = self.server.tls.wrap_socket(self.connection, server_side=True)
            stream = tls.makefile("rwb")
            while (inner := _read_request(stream)) is not None:
                if host == TOKEN_HOST:
                    self._send(stream, 200, [("Content-Type", "application/json")], TOKEN)
                else:
                    self._forward(stream, host, *inner)
            return
        self._send(self.wfile, 404, [], b"")

    def _forward(
        self, stream: Any, host: str, method: str, path: str, headers: list, body: bytes
    ) -> None:
        forwarded = {k: v for k, v in headers if k.lower() not in HOP_BY_HOP}
        forwarded["Host"] = f"127.0.0.1:{self.server.emulator_port}"
        forwarded["Content-Length"] = str(len(body))
        with self.server.emulator_lock:  # the emulator serves one request at a time
            connection = http.client.HTTPConnection("127.0.0.1", self.server.emulator_port)
            connection.request(method, path, body=body, headers=forwarded)
            response = connection.getresponse()
            data = response.read()
            reply = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP]
            connection.close()
        emulator = f"http://127.0.0.1:{self.server.emulator_port}"
        reply = [
            (k, v.replace(emulator, f"https://{host}")) if k.lower() == "location" else (k, v)
            for k, v in reply
        ]
        self._send(stream, response.status, reply, data, response.reason)

    @staticmethod
    def _send(stream: Any, status: int, headers: list, body: bytes, reason: str = "") -> None:
        head = f"HTTP/1.1 {status} {reason or 'OK'}\r\n"
        for key, value in [*headers, ("Content-Length", str(len(body)))]:
            head += f"{key}: {value}\r\n"
        stream.write(head.encode("latin-1") + b"\r\n" + body)
        stream.flush()


TOKEN = json.dumps({"access_token": "dummy", "expires_in": 3600, "token_type": "Bearer"}).encode()


class _ProxyServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, emulator_port: int, cert: str, key: str) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.emulator_port = emulator_port
        self.emulator_lock = threading.Lock()
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(cert, key)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# TensorFlow's gs:// file system, as the tests use it: no cached metadata (a test reads right
# after another process wrote), and no read buffer (64 MB unless set, made anew for every file
# opened: 40 ms for each small JSON read or copied). TensorFlow reads these when it is
# imported, so a fork server's programs have the server's (tests/conftest.py).
TENSORFLOW_GCS_SETTINGS = {
    "GCS_STAT_CACHE_MAX_AGE": "0",
    "GCS_MATCHING_PATHS_CACHE_MAX_AGE": "0",
    "GCS_READ_CACHE_BLOCK_SIZE_MB": "0",
}


def client_env(emulator_port: int, proxy_port: int, cert: str, credentials: str) -> dict:
    """What a process (TensorFlow, Beam, google-cloud-storage) needs to use the emulator."""
    return {
        "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{emulator_port}",
        "HTTPS_PROXY": f"http://127.0.0.1:{proxy_port}",
        "https_proxy": f"http://127.0.0.1:{proxy_port}",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "CURL_CA_BUNDLE": cert,
        "REQUESTS_CA_BUNDLE": cert,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "dummy",
        "GOOGLE_APPLICATION_CREDENTIALS": credentials,
        "GOOGLE_CLOUD_PROJECT": "test-project",
        "NO_GCE_CHECK": "true",
        **TENSORFLOW_GCS_SETTINGS,
    }


@contextlib.contextmanager
def running(workdir: Path, bucket: str) -> Iterator[dict[str, str]]:
    """The emulator and its proxy in a process of their own, on free loopback ports, with
    `bucket` made; yields the environment its clients need. Its log is workdir/emulator.log."""
    log_path = workdir / "emulator.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.gcs_emulator",
                f"--workdir={workdir}",
                f"--bucket={bucket}",
            ],
            cwd=Path(__file__).resolve().parent.parent,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line, log_path.read_text()[-3000:]
        yield json.loads(line)["env"]
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.gcs_emulator")
    parser.add_argument("--workdir", required=True, help="certificate, credentials, objects")
    parser.add_argument("--bucket", action="append", default=[], help="bucket to create")
    args = parser.parse_args()
    patch_emulator()
    from gcp_storage_emulator.server import create_server

    cert, key = write_certificate(args.workdir)
    credentials = os.path.join(args.workdir, "credentials.json")
    emulator_port = _free_port()
    emulator = create_server("127.0.0.1", emulator_port, in_memory=True)
    emulator.start()
    proxy = _ProxyServer(emulator_port, cert, key)
    proxy_port = proxy.server_address[1]
    with open(credentials, "w") as f:
        json.dump(
            {
                "type": "authorized_user",
                "client_id": "test",
                "client_secret": "test",
                "refresh_token": "test",
            },
            f,
        )
    from gcp_storage_emulator.handlers import buckets

    for bucket in args.bucket:
        buckets.create_bucket(bucket, emulator._storage)
    # shutdown() waits for the loop's next poll: poll often, stop at once.
    threading.Thread(
        target=proxy.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    ).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    env = client_env(emulator_port, proxy_port, cert, credentials)
    print(json.dumps({"env": env}), flush=True)
    stop.wait()
    proxy.shutdown()
    emulator.stop()


if __name__ == "__main__":
    main()
