"""The shared contract: the test factory's shard set verifies, and tampering is caught."""

from __future__ import annotations

import os

import pytest

from contract import layout, manifest


def test_shard_set_verifies(shard_set):
    data_dir, doc = shard_set
    assert manifest.verify(data_dir) == doc
    paths = manifest.shard_paths_for_worker(data_dir, doc, 1)
    assert [os.path.basename(p) for p in paths] == [
        "worker-00001-of-00002-file-00000-of-00001.tfrecord"
    ]


def test_flipped_byte_is_named(shard_set):
    data_dir, doc = shard_set
    path = os.path.join(data_dir, layout.worker_file_name(0, 2, 0, 1))
    with open(path, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(manifest.ManifestError, match="checksum mismatch: .*worker-00000"):
        manifest.verify(data_dir)
    # Worker 1's own files are still intact.
    manifest.verify(data_dir, split=layout.TRAIN_SPLIT, worker=1)


def test_missing_manifest(tmp_path):
    with pytest.raises(manifest.ManifestError, match="manifest not found"):
        manifest.read_manifest(str(tmp_path))
