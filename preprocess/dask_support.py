"""Beam's DaskRunner on a dask.distributed cluster: the project's code shipped to the workers
and the number of partitions sized from the data."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import tempfile
import zipfile
from collections.abc import Iterator

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from preprocess import shard_set

CODE_PACKAGES = ("contract", "preprocess")
# Run on each worker before an upload: distributed reloads only a package's __init__, so
# submodules of an earlier upload would stay in sys.modules and run old code.
FORGET_PROJECT_MODULES = (
    "import sys\n"
    f"for name in [n for n in sys.modules if n.split('.')[0] in {CODE_PACKAGES!r}]:\n"
    "    del sys.modules[name]\n"
)
log = logging.getLogger(__name__)


def is_dask(options: PipelineOptions) -> bool:
    """Whether the pipeline runs on Beam's DaskRunner."""
    runner = options.view_as(StandardOptions).runner or ""
    return str(runner).rsplit(".", 1)[-1] == "DaskRunner"


def code_zip(folder: str) -> str:
    """Zips the packages the job's steps import; the name carries the contents' digest, so a
    worker never keeps an older upload of the same name."""
    members = []
    for package in CODE_PACKAGES:
        top = shard_set.PROJECT_ROOT / package
        for path in sorted(top.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                members.append((path, path.relative_to(shard_set.PROJECT_ROOT).as_posix()))
    digest = hashlib.sha256()
    for path, name in members:
        digest.update(name.encode() + b"\0" + path.read_bytes())
    zip_path = os.path.join(folder, f"nightly_trainer_code_{digest.hexdigest()[:12]}.zip")
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, name in members:
            archive.write(path, name)
    return zip_path


@contextlib.contextmanager
def loopback_cluster() -> Iterator[str]:
    """A LocalCluster whose scheduler, workers and dashboard listen on 127.0.0.1 only.

    Yields:
        The scheduler's address.
    """
    from distributed import LocalCluster

    with LocalCluster(host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster:
        log.info("a local Dask cluster at %s for this run", cluster.scheduler_address)
        yield cluster.scheduler_address


def prepare(
    beam_args: list[str],
    data_bytes: int,
    bucket_bytes: int,
    cleanup: contextlib.ExitStack | None = None,
) -> list[str]:
    """Ships the project's code to the cluster's workers and, unless the user chose a
    partitioning, asks for partitions of about `bucket_bytes` (at least two per worker).

    Without `--dask_client_address`, Beam's DaskRunner would start a LocalCluster whose
    dashboard (no authentication) listens on every interface; with `cleanup`, this starts
    one on loopback instead (`loopback_cluster`), which `cleanup` stops.

    Only paths and counts travel between steps (records go through fragment files), so the
    partition count sets parallelism: Beam's default (128 read tasks per partition) would put
    a whole dataset's reads in one task and leave the other workers idle.

    Returns:
        The Beam flags to run with.
    """
    from apache_beam.runners.dask.dask_runner import DaskOptions
    from distributed import Client
    from distributed.diagnostics.plugin import UploadFile

    dask = PipelineOptions(beam_args).view_as(DaskOptions)
    address = getattr(dask, "address", None)
    own_cluster = not address and cleanup is not None
    if own_cluster:
        assert cleanup is not None
        address = cleanup.enter_context(loopback_cluster())
        beam_args = [*beam_args, f"--dask_client_address={address}"]
    workers = 1
    if address:
        with tempfile.TemporaryDirectory() as folder, Client(address, timeout=60) as client:
            client.run(exec, FORGET_PROJECT_MODULES)  # a builtin: needs no project code
            if own_cluster:
                # Its scheduler runs in this process, which has the code: upload_file would
                # also put the zip on this process's sys.path, from a folder removed with
                # the cluster, and later imports here would fail on the missing file.
                client.register_plugin(UploadFile(code_zip(folder)))
            else:
                client.upload_file(code_zip(folder))
            workers = max(1, len(client.scheduler_info()["workers"]))
            log.info("shipped %s to %d Dask workers at %s", CODE_PACKAGES, workers, address)
    if getattr(dask, "npartitions", None) or getattr(dask, "partition_size", None):
        return beam_args
    partitions = max(2 * workers, math.ceil(data_bytes / max(1, bucket_bytes)))
    return [*beam_args, f"--dask_npartitions={partitions}"]
