"""Where a run's files may live: local paths and gs://, and the local folder a remote root keeps.

Every stage reads and writes through `tf.io.gfile` (and Beam's FileSystems), so an output root
is either a local path or a `gs://bucket/...` URL. Other schemes are refused up front by
`check_supported` (TensorFlow 2.21 has no s3:// filesystem, so training could not write there
even when Beam and Luigi could).

Some things cannot live on an object store: flock locks and logs that are appended while a
stage runs. For a remote root they go to `local_state_dir(path)`, a local mirror of the remote
path under `$NIGHTLY_TRAINER_STATE_DIR` (default `~/.cache/nightly-trainer`), for example
`~/.cache/nightly-trainer/gs/bucket/runs/2026-01-31/logs`. Logs are copied to the store when
the process writing them is done with them (`contract.gfile.upload_folder`).
"""

from __future__ import annotations

import os

from contract.settings import SettingsError

SUPPORTED_SCHEMES = ("gs",)
STATE_DIR_ENV = "NIGHTLY_TRAINER_STATE_DIR"
DEFAULT_STATE_DIR = os.path.join("~", ".cache", "nightly-trainer")


class UnsupportedStorageError(SettingsError):
    """A path names a storage scheme the stages cannot write to."""


def scheme(path: str) -> str:
    """The URL scheme of `path` (`gs` for `gs://b/x`), or '' for a local path."""
    head, sep, _ = path.partition("://")
    return head.lower() if sep else ""


def is_remote(path: str) -> bool:
    """Whether `path` is a URL (gs://...) rather than a local path."""
    return bool(scheme(path))


def absolute(path: str) -> str:
    """A local path made absolute (Beam's workers run in other folders); URLs unchanged."""
    return path if is_remote(path) else os.path.abspath(path)


def check_supported(path: str, what: str = "output root") -> None:
    """Refuses a path whose scheme no stage can use, before any work is done.

    Raises:
        UnsupportedStorageError: naming the scheme, the path and what is supported.
    """
    found = scheme(path)
    if found and found not in SUPPORTED_SCHEMES:
        supported = ", ".join(f"{s}://" for s in SUPPORTED_SCHEMES)
        raise UnsupportedStorageError(
            f"{what} {path} uses storage scheme '{found}://', which this pipeline does not "
            f"support (TensorFlow has no {found} filesystem here); use a local path or {supported}"
        )


def state_root() -> str:
    """The local folder that holds what remote roots cannot: locks and logs being written."""
    return os.path.expanduser(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def local_state_dir(path: str) -> str:
    """`path` itself when local; for a URL, its mirror under `state_root()` (gs/bucket/...)."""
    found = scheme(path)
    if not found:
        return path
    rest = path.partition("://")[2].strip("/")
    parts = [p for p in rest.split("/") if p not in ("", ".", "..")]
    return os.path.join(state_root(), found, *parts)
