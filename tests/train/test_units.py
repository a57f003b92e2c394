"""Fast checks of the cluster, config, registry and summary helpers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from train import cluster, models, summaries
from train.config import ConfigError, TrainConfig


def test_tf_config_round_trip():
    addresses = ["127.0.0.1:1111", "127.0.0.1:2222", "127.0.0.1:3333"]
    for index in range(3):
        env = {cluster.TF_CONFIG_ENV: cluster.tf_config_json(addresses, index)}
        info = cluster.read_cluster(env)
        assert (info.worker_index, info.num_workers, info.is_chief) == (index, 3, index == 0)


def test_tfjob_chief_counts_as_worker_zero():
    spec = {"cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1"]}}
    chief = cluster.read_cluster(
        {"TF_CONFIG": json.dumps({**spec, "task": {"type": "chief", "index": 0}})}
    )
    worker = cluster.read_cluster(
        {"TF_CONFIG": json.dumps({**spec, "task": {"type": "worker", "index": 1}})}
    )
    assert (chief.worker_index, chief.is_chief, chief.num_workers) == (0, True, 3)
    assert (worker.worker_index, worker.is_chief) == (2, False)


def test_no_tf_config_is_a_cluster_of_one():
    assert cluster.read_cluster({}) == cluster.ClusterInfo(worker_index=0, num_workers=1)


@pytest.mark.parametrize(
    "raw, message",
    [
        ("not json", "TF_CONFIG is malformed"),
        ('{"cluster": {"worker": ["a:1"]}}', "TF_CONFIG is malformed"),
        ('{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}}', "task type 'ps'"),
    ],
)
def test_bad_tf_config(raw, message):
    with pytest.raises(cluster.ClusterError, match=message):
        cluster.read_cluster({"TF_CONFIG": raw})


def test_config_round_trip_and_unknown_keys(tmp_path):
    config = TrainConfig(data_dir="d", train_dir="t", epochs=3)
    path = str(tmp_path / "config.json")
    config.write(path)
    assert TrainConfig.read(path) == config
    with pytest.raises(ConfigError, match="unknown training settings: colour"):
        TrainConfig.from_dict({**config.to_dict(), "colour": "red"})


def test_registry_builds_softmax_models():
    for name in models.MODELS:
        model = models.build(name, [28, 28, 1], 10)
        out = model(np.full([2, 28, 28, 1], 255.0, np.float32), training=False).numpy()
        assert out.shape == (2, 10)
        np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)


def test_histogram_buckets_count_every_value():
    values = tf.constant([[-1.0, 0.0], [0.5, 3.0]])
    buckets = summaries.histogram_buckets(values, buckets=4).numpy()
    assert buckets.shape == (4, 3)
    assert buckets[:, 2].sum() == 4
    assert buckets[0, 0] == -1.0 and buckets[-1, 1] == 3.0
    constant = summaries.histogram_buckets(tf.zeros([5])).numpy()
    assert constant[:, 2].sum() == 5


def test_file_io_is_retried_with_backoff():
    from train import artifacts

    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise OSError("transient")
        return "done"

    assert artifacts.with_retries(flaky, "flaky", attempts=3, first_delay=0.001) == "done"
    assert len(calls) == 3
    calls.clear()
    with pytest.raises(OSError, match="transient"):
        artifacts.with_retries(flaky, "flaky", attempts=2, first_delay=0.001)
    assert len(calls) == 2


def test_best_epoch_is_one_based():
    from train import artifacts

    assert artifacts.best_epoch([0.5, 0.3, 0.4]) == 2
    assert artifacts.best_epoch([]) == 0
