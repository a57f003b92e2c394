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


def test_gfile_reaches_local_files_as_tf_io_gfile_does(tmp_path):
    import tensorflow as tf

    from contract import gfile

    folder = str(tmp_path / "a" / "b")
    gfile.makedirs(folder)
    gfile.makedirs(folder)  # already there: nothing to do
    path = f"{folder}/x.json"
    with gfile.GFile(path, "w") as f:
        f.write("{}")
    assert gfile.exists(path) and not gfile.isdir(path) and gfile.isdir(folder)
    assert gfile.stat(path).length == tf.io.gfile.stat(path).length == 2
    gfile.copy(path, f"{folder}/y.json")
    with pytest.raises(FileExistsError):
        gfile.copy(path, f"{folder}/y.json")
    with pytest.raises(FileExistsError):
        gfile.rename(path, f"{folder}/y.json")
    gfile.rename(path, f"{folder}/y.json", overwrite=True)
    assert sorted(gfile.listdir(folder)) == sorted(tf.io.gfile.listdir(folder)) == ["y.json"]
    assert list(gfile.walk(str(tmp_path))) == [
        (str(tmp_path), ["a"], []),
        (str(tmp_path / "a"), ["b"], []),
        (folder, [], ["y.json"]),
    ]
    with pytest.raises(gfile.not_found_errors()):
        gfile.remove(path)
    gfile.rmtree(str(tmp_path / "a"))
    assert not gfile.exists(folder)
    assert tf.errors.NotFoundError in gfile.not_found_errors()  # TensorFlow is loaded here
    assert gfile.file_errors() == (OSError, tf.errors.OpError)
