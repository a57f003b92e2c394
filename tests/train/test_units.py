"""Fast checks of the cluster, config, registry and summary helpers."""

from __future__ import annotations

import json
import logging
import socket
import threading
import types

import numpy as np
import pytest

from contract import manifest
from train import callbacks, cluster, local_backend, models
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


def test_every_registered_model_takes_a_training_step():
    """Each model trains: a step on a batch moves every trainable weight."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, [8, 28, 28, 1]).astype(np.float32)
    labels = rng.integers(0, 10, [8])
    for name in models.MODELS:
        model = models.build(name, [28, 28, 1], 10)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        before = [w.numpy() for w in model.trainable_weights]
        loss = float(model.train_on_batch(images, labels))
        assert np.isfinite(loss), name
        after = [w.numpy() for w in model.trainable_weights]
        changed = [not np.array_equal(b, a) for b, a in zip(before, after, strict=True)]
        assert changed and all(changed), name


def branching_model(branch: bool = True):
    """A softmax over flattened images; with `branch`, a layer after it that branches on a
    tensor in Python, as user code may (only autograph turns that into graph ops)."""
    import tensorflow as tf
    import tf_keras as keras

    class Doubles(keras.layers.Layer):
        def call(self, x):
            if tf.reduce_sum(x) > 0:
                return x * 2.0
            return x

    inputs = keras.Input([28, 28, 1])
    scores = keras.layers.Dense(10, activation="softmax")(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, Doubles()(scores) if branch else scores)


def test_the_train_step_is_converted_by_autograph_only_where_user_code_may_need_it():
    """A built-in model's train step is traced as written; a model by import path keeps
    autograph, which its layers may need to branch on a tensor."""
    import tensorflow as tf

    from train.trainer import Trainer

    def fit(core, autograph: bool) -> Trainer:
        options = tf.distribute.experimental.CommunicationOptions()
        trainer = Trainer(core, 0, options, autograph=autograph)
        trainer.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        images = np.ones([4, 28, 28, 1], np.float32)
        trainer.fit(images, np.arange(4), batch_size=2, epochs=1, verbose=0)
        return trainer

    assert models.is_built_in("mlp") and not models.is_built_in("examples.my_model:build_model")
    plain = fit(models.build("mlp", [28, 28, 1], 10), autograph=False)
    assert plain.train_function is plain._traced_as_written
    assert int(plain.optimizer.iterations) == 2  # two batches of two
    assert int(fit(branching_model(), autograph=True).optimizer.iterations) == 2
    with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
        fit(branching_model(), autograph=False)


def test_validation_is_converted_by_autograph_only_where_user_code_may_need_it():
    """The exact validation of a built-in model is traced as written, as its train step is;
    a model by import path keeps autograph for its layers' branches on tensors."""
    import tensorflow as tf
    import tf_keras as keras

    from train.validation import ExactValidation

    def validate(model: keras.Model, autograph: bool) -> dict[str, float]:
        images = tf.data.Dataset.from_tensor_slices(
            (np.ones([6, 28, 28, 1], np.float32), np.arange(6, dtype=np.int64) % 3)
        )
        strategy = tf.distribute.get_strategy()
        return ExactValidation(model, images.batch(4), strategy, 6, autograph=autograph).evaluate()

    plain = validate(branching_model(branch=False), autograph=False)
    assert 0.0 <= plain["val_accuracy"] <= 1.0 and np.isfinite(plain["val_loss"])
    assert np.isfinite(validate(branching_model(), autograph=True)["val_loss"])
    with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
        validate(branching_model(), autograph=False)


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


def test_disk_full_is_not_retried():
    import errno

    from train import artifacts

    calls = []

    def full() -> None:
        calls.append(1)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        artifacts.with_retries(full, "full", attempts=3, first_delay=0.001)
    assert len(calls) == 1


def test_epoch_order_is_a_permutation_fixed_by_seed_worker_and_epoch():
    from train import data

    order = data.epoch_order(50, seed=3, worker=0, epoch=2).numpy()
    assert sorted(order) == list(range(50))
    np.testing.assert_array_equal(order, data.epoch_order(50, seed=3, worker=0, epoch=2))
    for other in (
        data.epoch_order(50, seed=4, worker=0, epoch=2),
        data.epoch_order(50, seed=3, worker=1, epoch=2),
        data.epoch_order(50, seed=3, worker=0, epoch=3),
    ):
        assert not np.array_equal(order, other.numpy())


@pytest.mark.parametrize("budget_mb, in_memory", [(1024, True), (0, False)])
def test_train_dataset_resumed_mid_epoch_feeds_the_same_batches(tmp_path, budget_mb, in_memory):
    from tests.train.conftest import write_small_shard_set
    from train import data

    shard_manifest = write_small_shard_set(str(tmp_path))
    plan = data.input_plan(shard_manifest, 1, 48, budget_mb)
    assert plan.in_memory == in_memory and plan.window >= 48
    steps = manifest.steps_per_epoch(shard_manifest, 48)  # 256 // 48 = 5, 16 examples left out

    def batches(start_epoch: int, start_step: int, count: int) -> list[bytes]:
        dataset = data.train_dataset(
            str(tmp_path), shard_manifest, 1, 48, seed=5, start_epoch=start_epoch,
            start_step=start_step, memory_budget_mb=budget_mb,
        )  # fmt: skip
        return [x.numpy().tobytes() + y.numpy().tobytes() for x, y in dataset.take(count)]

    whole = batches(0, 0, 3 * steps)
    assert batches(1, 3, 2 * steps - 3) == whole[steps + 3 :]
    assert batches(2, 0, steps) == whole[2 * steps :]
    assert whole[:steps] != whole[steps : 2 * steps]  # each epoch has its own order
    # An epoch holds distinct examples: the batches together hold steps * 48 different images.
    images = data.train_dataset(
        str(tmp_path), shard_manifest, 1, 48, seed=5, memory_budget_mb=budget_mb
    ).take(steps)
    distinct = {image.tobytes() for x, _ in images for image in x.numpy()}
    assert len(distinct) == steps * 48


@pytest.mark.parametrize("budget_mb", [1024, 0], ids=["in-memory", "streamed"])
def test_multi_worker_steps_do_not_all_reduce_whether_input_remains(tmp_path, budget_mb):
    """tf.distribute's own decision: for a dataset not known to be endless, every step of a
    multi-worker fit would all-reduce whether any worker still has data."""
    from tensorflow.python.distribute import input_lib

    from tests.train.conftest import write_small_shard_set
    from train import data

    shard_manifest = write_small_shard_set(str(tmp_path))
    dataset = data.train_dataset(
        str(tmp_path), shard_manifest, 0, 48, seed=5, memory_budget_mb=budget_mb
    )
    multi_worker = types.SimpleNamespace(
        extended=types.SimpleNamespace(
            experimental_enable_get_next_as_optional=True, _in_multi_worker_mode=lambda: True
        )
    )
    decide = input_lib._enable_get_next_as_optional
    assert decide(multi_worker, dataset, dataset.cardinality()) is False
    unknown_length = dataset.filter(lambda x, y: True)
    assert decide(multi_worker, unknown_length, unknown_length.cardinality()) is True


def test_run_state_round_trips_through_json():
    from train.backup import RunState

    state = RunState(
        epoch=2,
        step=7,
        epoch_logs={0: {"loss": 0.5}, 1: {"loss": 0.25}},
        best_epoch=1,
        best_val_loss=0.1 + 0.2,
        early_stopping={"wait": 1, "best": float("inf"), "stopped_epoch": 0},
        epoch_timings={0: [10.0, 2.5, 1.0], 1: [10.0, 1.25, 0.0]},
    )
    text = json.dumps(state.to_json())
    assert RunState.from_json(json.loads(text)) == state


def test_run_throughput_counts_every_attempts_epochs_but_their_first():
    from train.backup import RunState
    from train.callbacks import RunRecorder

    # Epochs 0-1 by a first attempt, epoch 2 (a partial epoch, 4 steps) by a restart.
    timings = {0: [10.0, 9.0, 1.0], 1: [10.0, 1.0, 0.0], 2: [4.0, 7.0, 1.0]}
    recorder = RunRecorder(RunState(epoch_timings=timings), False, 3, global_batch_size=8)
    assert recorder.examples_per_second() == 10 * 8 / 1.0
    # A restarted run whose attempts each timed one epoch: all of them count.
    only_firsts = {0: [10.0, 2.0, 1.0], 1: [10.0, 3.0, 1.0]}
    recorder = RunRecorder(RunState(epoch_timings=only_firsts), False, 2, global_batch_size=8)
    assert recorder.examples_per_second() == 20 * 8 / 5.0
    assert RunRecorder(RunState(), False, 2, global_batch_size=8).examples_per_second() == 0.0


def test_resuming_with_other_settings_is_refused(tmp_path):
    from contract import atomic
    from tests.train.conftest import write_small_shard_set
    from train import backup

    data_dir, train_dir = str(tmp_path / "data"), str(tmp_path / "train")
    shard_manifest = write_small_shard_set(data_dir)
    config = TrainConfig(data_dir=data_dir, train_dir=train_dir, epochs=3, seed=1)
    folder = tmp_path / "train" / "backup"
    folder.mkdir(parents=True)
    atomic.write_json_atomic(
        str(folder / backup.SETTINGS_FILE), backup.fingerprint(config, shard_manifest, 2)
    )
    # Settings without a checkpoint yet: nothing to resume, nothing to refuse.
    changed = TrainConfig(data_dir=data_dir, train_dir=train_dir, epochs=4, seed=1)
    backup.check_resume_settings(changed, shard_manifest, 2)

    atomic.write_json_atomic(str(folder / backup.STATE_FILE), backup.RunState().to_json())
    backup.check_resume_settings(config, shard_manifest, 2)
    # Frequencies may change between attempts.
    relaxed = TrainConfig(
        data_dir=data_dir, train_dir=train_dir, epochs=3, seed=1, save_freq_steps=7,
        scalar_freq_steps=0,
    )  # fmt: skip
    backup.check_resume_settings(relaxed, shard_manifest, 2)
    # Threads split each reduction another way: another rounding.
    threads = TrainConfig(data_dir=data_dir, train_dir=train_dir, epochs=3, seed=1,
                          threads_per_worker=2)  # fmt: skip
    with pytest.raises(ConfigError, match="threads_per_worker 1 -> 2"):
        backup.check_resume_settings(threads, shard_manifest, 2)
    streamed = TrainConfig(
        data_dir=data_dir, train_dir=train_dir, epochs=3, seed=1, input_memory_budget_mb=0
    )
    with pytest.raises(ConfigError, match="input 'memory,memory' -> 'stream-window-"):
        backup.check_resume_settings(streamed, shard_manifest, 2)
    with pytest.raises(ConfigError) as refused:
        backup.check_resume_settings(changed, shard_manifest, 3)
    message = str(refused.value)
    assert "epochs 3 -> 4" in message and "num_workers 2 -> 3" in message
    assert "seed" not in message
    assert "--force-stage train" in message and "backup's settings" in message


def test_device_datasets_of_a_distributed_iterator_run_without_autotuning(monkeypatch):
    import tensorflow as tf
    from tensorflow.python.data.ops import multi_device_iterator_ops as ops

    from train import data

    # TF's own function, even if a training run in this process has already replaced it.
    create = ops._create_device_dataset
    monkeypatch.setattr(ops, "_create_device_dataset", getattr(create, "original", create))

    def device_pipeline() -> tuple[bool | None, list[int]]:
        iterator = ops.OwnedMultiDeviceIterator(tf.data.Dataset.range(7), ["/cpu:0"])
        enabled = iterator._device_iterators[0]._dataset.options().autotune.enabled
        return enabled, [int(element[0]) for element in iterator]

    tuned, tuned_elements = device_pipeline()
    data.untune_device_datasets()
    patched = ops._create_device_dataset
    data.untune_device_datasets()
    assert ops._create_device_dataset is patched  # a second call does not wrap again
    untuned, untuned_elements = device_pipeline()
    assert tuned is not False  # TF's default: autotuned, hence the wait when fit returns
    assert untuned is False
    assert untuned_elements == tuned_elements == list(range(7))


def test_resuming_a_backup_of_other_library_versions_or_without_settings_is_refused(tmp_path):
    import tensorflow as tf

    from contract import atomic
    from tests.train.conftest import write_small_shard_set
    from train import backup

    data_dir, train_dir = str(tmp_path / "data"), str(tmp_path / "train")
    shard_manifest = write_small_shard_set(data_dir)
    config = TrainConfig(data_dir=data_dir, train_dir=train_dir, epochs=3)
    folder = tmp_path / "train" / "backup"
    folder.mkdir(parents=True)
    atomic.write_json_atomic(str(folder / backup.STATE_FILE), backup.RunState().to_json())
    with pytest.raises(ConfigError, match=f"has no {backup.SETTINGS_FILE}") as refused:
        backup.check_resume_settings(config, shard_manifest, 2)
    assert "--force-stage train" in str(refused.value)

    older = backup.fingerprint(config, shard_manifest, 2) | {"tensorflow": "2.0.0"}
    atomic.write_json_atomic(str(folder / backup.SETTINGS_FILE), older)
    with pytest.raises(ConfigError, match=f"tensorflow '2.0.0' -> '{tf.__version__}'"):
        backup.check_resume_settings(config, shard_manifest, 2)
    del older["tensorflow"], older["keras"]  # a backup made before versions were recorded
    atomic.write_json_atomic(str(folder / backup.SETTINGS_FILE), older)
    with pytest.raises(ConfigError, match="keras None -> "):
        backup.check_resume_settings(config, shard_manifest, 2)


def test_a_fault_plan_gives_each_attempt_its_own_kill(monkeypatch):
    monkeypatch.setenv(callbacks.FAULT_ENV, "1:23, 0:validated-2")
    assert [callbacks.fault_point(1, attempt) for attempt in range(3)] == ["23", "", ""]
    assert [callbacks.fault_point(0, attempt) for attempt in range(3)] == ["", "validated-2", ""]
    monkeypatch.setenv(callbacks.FAULT_ENV, "0:saved")
    assert [callbacks.fault_point(0, attempt) for attempt in range(2)] == ["saved", ""]
    monkeypatch.delenv(callbacks.FAULT_ENV)
    assert callbacks.fault_point(0, 0) == ""


@pytest.mark.parametrize(("hold", "held_at"), [("epoch-2", [3]), ("4", [4]), ("", [])])
def test_a_hold_stops_the_first_attempt_at_its_step_or_at_its_epochs_first_step(
    monkeypatch, caplog, hold, held_at
):
    """Three steps an epoch: `epoch-2` holds as global step 3 begins, `4` at step 4; with
    SIGTERM already seen the hold returns at once, so the log line is what is left of it."""
    import tensorflow as tf
    import tf_keras

    monkeypatch.setenv(cluster.HOLD_ENV, hold)
    monkeypatch.setattr(callbacks, "SIGTERM_SEEN", threading.Event())
    callbacks.SIGTERM_SEEN.set()
    model = tf_keras.Sequential([tf_keras.layers.Dense(2, input_shape=(3,))])
    model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensor_slices((tf.zeros((6, 3)), tf.zeros((6, 2)))).batch(2)
    with caplog.at_level(logging.INFO, logger="train"):
        model.fit(data, epochs=3, verbose=0, callbacks=[callbacks.FaultInjection(0, attempt=0)])
    holds = [r.getMessage() for r in caplog.records if r.getMessage().startswith("FAULT hold")]
    assert holds == [f"FAULT holding at step {step} until SIGTERM" for step in held_at]
    later = callbacks.FaultInjection(0, attempt=1)  # a restart never holds
    assert later.hold_at is None and later.hold_at_epoch is None


def test_free_ports_come_from_below_the_ephemeral_range_and_can_be_bound():
    # Outgoing connections take their local ports from the ephemeral range: a worker's port
    # picked there could be taken by one before the worker binds it.
    low = local_backend.ephemeral_range_start()
    ports = local_backend.free_ports(3)
    assert len(set(ports)) == 3
    assert all(max(1024, low - local_backend.LISTEN_SPAN) <= port < low for port in ports)
    for port in ports:
        local_backend.check_port_free(port)


def test_a_port_in_use_is_never_picked(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind((local_backend.LOOPBACK, 0))
        busy = taken.getsockname()[1]
        # A range of one port below the span's end, the busy one: the kernel picks instead.
        monkeypatch.setattr(local_backend, "ephemeral_range_start", lambda: busy + 1)
        monkeypatch.setattr(local_backend, "LISTEN_SPAN", 1)
        (port,) = local_backend.free_ports(1)
        assert port != busy


def test_the_ephemeral_range_is_read_from_the_kernel_or_defaults(tmp_path):
    path = tmp_path / "ip_local_port_range"
    path.write_text("40000\t60999\n")
    assert local_backend.ephemeral_range_start(str(path)) == 40000
    assert local_backend.ephemeral_range_start(str(tmp_path / "missing")) == 32768
    path.write_text("garbage\n")
    assert local_backend.ephemeral_range_start(str(path)) == 32768


def test_a_save_reads_a_sync_on_read_variable_across_replicas_once(tmp_path, monkeypatch):
    import tensorflow as tf
    from tensorflow.python.checkpoint import saveable_compat
    from tensorflow.python.distribute import values

    from train import backup

    assert saveable_compat._LEGACY_SAVEABLE_NAME == backup.LEGACY_SAVEABLE_NAME
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        variable = tf.Variable(
            2.0,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.MEAN,
        )
    assert isinstance(variable, values.SyncOnReadVariable)
    reads: list[int] = []
    read_across = values.SyncOnReadVariable._get_cross_replica

    def counted(self):
        reads.append(1)
        return read_across(self)

    monkeypatch.setattr(values.SyncOnReadVariable, "_get_cross_replica", counted)
    tf.train.Checkpoint(v=variable).write(str(tmp_path / "plain"))
    plain = len(reads)
    reads.clear()
    backup.answer_legacy_saveable_name([variable])
    prefix = tf.train.Checkpoint(v=variable).write(str(tmp_path / "answered"))
    assert plain > len(reads) == 1  # the name's lookups read it too, before
    assert tf.train.load_variable(prefix, "v/.ATTRIBUTES/VARIABLE_VALUE") == 2.0


@pytest.mark.parametrize(
    "values",
    [
        np.random.default_rng(3).normal(size=[784, 64]).astype(np.float32),
        np.array([0.0, 1.0, 1.0, 2.5, -7.0], np.float32),  # the greatest in the last bucket
        np.full([4, 3], 0.25, np.float32),  # one value: every count in the last bucket
        np.zeros([0], np.float32),
    ],
    ids=["normal", "few", "constant", "empty"],
)
def test_gradient_histograms_bucket_as_tensorboards_own_summary_op(values):
    import tensorflow as tf
    from tensorboard.plugins.histogram import summary_v2

    from train import trainer

    expected = summary_v2._buckets(tf.constant(values), trainer.HISTOGRAM_BUCKETS).numpy()
    buckets = trainer.histogram_buckets(values)
    assert buckets.shape == expected.shape == (trainer.HISTOGRAM_BUCKETS, 3)
    np.testing.assert_array_equal(buckets[:, 2], expected[:, 2])
    np.testing.assert_allclose(buckets[:, :2], expected[:, :2], rtol=1e-12, atol=0)
    summary = tf.compat.v1.Summary.FromString(trainer.histogram_summary({"gradients/w": values}))
    (value,) = summary.value
    assert (value.tag, value.metadata.plugin_data.plugin_name) == ("gradients/w", "histograms")
    np.testing.assert_array_equal(tf.make_ndarray(value.tensor), buckets)
