"""Augmentation (training batches only, seeded), the cosine schedule, label smoothing and
test-time flips."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from contract import manifest
from tests.train.conftest import write_small_shard_set
from train import data, models, warm_start, worker
from train.config import ConfigError, TrainConfig, read_cpu_flags

BATCH = 48


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory) -> tuple[str, dict]:
    data_dir = str(tmp_path_factory.mktemp("shards"))
    return data_dir, write_small_shard_set(data_dir, num_workers=1)


def batches(shard_set, count: int, augment: str, seed: int = 5, start_epoch=0, start_step=0):
    data_dir, doc = shard_set
    dataset = data.train_dataset(
        data_dir, doc, 0, BATCH, seed=seed, start_epoch=start_epoch, start_step=start_step,
        augment=augment,
    )  # fmt: skip
    return [(x.numpy(), y.numpy()) for x, y in dataset.take(count)]


def variants(image: np.ndarray, shift: int) -> list[np.ndarray]:
    """Every flip and whole-pixel shift of one HxWxC image, zeros filling in."""
    out = []
    h, w = image.shape[:2]
    for flipped in (image, image[:, ::-1]):
        padded = np.pad(flipped, ((shift, shift), (shift, shift), (0, 0)))
        for dy in range(-shift, shift + 1):
            for dx in range(-shift, shift + 1):
                out.append(padded[shift + dy : shift + dy + h, shift + dx : shift + dx + w])
    return out


def test_augmented_batches_are_flips_and_shifts_of_the_same_examples(shard_set):
    plain = batches(shard_set, 3, "off")
    augmented = batches(shard_set, 3, "flip-shift")
    changed = 0
    for (x, y), (ax, ay) in zip(plain, augmented, strict=True):
        assert np.array_equal(y, ay)  # same examples, same order: only the pixels change
        for image, out in zip(x, ax, strict=True):
            assert any(np.array_equal(out, v) for v in variants(image, data.AUGMENT_SHIFT))
            changed += not np.array_equal(out, image)
    assert changed > 0.8 * 3 * BATCH  # 1 in 50 draws is the identity


def test_augmentation_is_seeded_and_resumes_exactly(shard_set):
    steps = manifest.steps_per_epoch(shard_set[1], BATCH)
    whole = batches(shard_set, 2 * steps, "flip-shift")
    again = batches(shard_set, 2 * steps, "flip-shift")
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(whole, again, strict=True))
    resumed = batches(shard_set, steps - 2, "flip-shift", start_epoch=1, start_step=2)
    for a, b in zip(whole[steps + 2 :], resumed, strict=True):
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    other = batches(shard_set, 1, "flip-shift", seed=6)
    assert not np.array_equal(other[0][0], whole[0][0])


def test_validation_batches_are_never_augmented(shard_set):
    data_dir, doc = shard_set
    records = tf.data.TFRecordDataset(
        [f"{data_dir}/{f['path']}" for f in doc["files"] if f["split"] == "validation"]
    )
    raw = np.concatenate(
        [x.numpy() for x, _ in records.batch(64).map(data._parse(doc["image_shape"]))]
    )
    seen = np.concatenate([x.numpy() for x, _ in data.validation_dataset(data_dir, doc, 0, 1, 64)])
    assert np.array_equal(raw, seen)


def test_cosine_schedule_warms_up_then_decays_to_zero():
    config = TrainConfig(
        data_dir="d", train_dir="t", epochs=10, learning_rate=0.004, lr_schedule="cosine",
        warmup_epochs=2,
    )  # fmt: skip
    schedule = worker.learning_rate(config, steps_per_epoch=100)
    rate = {step: float(schedule(step)) for step in (0, 100, 200, 600, 1000)}
    assert rate[0] == 0.0
    assert rate[100] == pytest.approx(0.002)  # half-way through the warm-up
    assert rate[200] == pytest.approx(0.004)  # the peak, then cosine over 800 steps
    assert rate[600] == pytest.approx(0.002, rel=1e-5)  # cos(pi / 2): half the peak
    assert rate[1000] == pytest.approx(0.0, abs=1e-9)
    assert worker.learning_rate(TrainConfig(data_dir="d", train_dir="t"), 100) == 3e-3


def test_a_warm_run_fine_tunes_then_restarts_its_schedule_and_a_cold_run_does_not():
    shared = {
        "data_dir": "d", "train_dir": "t", "epochs": 10, "learning_rate": 0.004,
        "lr_schedule": "cosine", "warmup_epochs": 1, "warm_start": "last-blessed",
        "warm_start_finetune_epochs": 2,
    }  # fmt: skip
    warm = TrainConfig(**shared, warm_start_from="m.keras", warm_start_sha256="ab")
    schedule = worker.learning_rate(warm, steps_per_epoch=100)
    rate = {step: float(schedule(step)) for step in (0, 100, 199, 200, 250, 300, 750, 1200)}
    assert rate[0] == pytest.approx(0.0004)  # a tenth of the peak, falling
    assert rate[100] == pytest.approx(0.0002)  # half-way down: cos(pi / 2)
    assert 0 < rate[199] < 1e-6
    assert rate[200] == 0.0  # the restart's warm-up from 0 ...
    assert rate[250] == pytest.approx(0.002)
    assert rate[300] == pytest.approx(0.004)  # ... to the peak, then cosine: the 10 epochs'
    assert rate[750] == pytest.approx(0.002, rel=1e-5)  # 900 steps after the warm-up
    assert rate[1200] == pytest.approx(0.0, abs=1e-9)
    assert warm_start.total_epochs(warm) == 12
    own_rate = dataclasses.replace(warm, warm_start_finetune_learning_rate=0.001)
    assert float(worker.learning_rate(own_rate, 100)(0)) == pytest.approx(0.001)
    cold = TrainConfig(**shared, cold_start_reason="no blessed model yet")
    assert float(worker.learning_rate(cold, 100)(100)) == pytest.approx(0.004)
    assert warm_start.total_epochs(cold) == 10
    again = worker.FineTuneFirst.from_config(schedule.get_config())
    assert [float(again(s)) for s in rate] == pytest.approx(list(rate.values()))


def test_label_smoothing_moves_the_target_towards_uniform():
    probabilities = tf.constant([[0.7, 0.2, 0.1]])
    labels = tf.constant([0])
    plain = worker.loss(TrainConfig(data_dir="d", train_dir="t"), 3)(labels, probabilities)
    smoothed = worker.loss(TrainConfig(data_dir="d", train_dir="t", label_smoothing=0.3), 3)(
        labels, probabilities
    )
    target = np.array([0.7 + 0.1, 0.1, 0.1])  # 0.3 spread over 3 classes
    expected = -np.sum(target * np.log([0.7, 0.2, 0.1]))
    assert float(plain) == pytest.approx(-np.log(0.7), rel=1e-5)
    assert float(smoothed) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"augment": "mixup"}, "augment must be one of off, flip-shift"),
        ({"lr_schedule": "step"}, "lr_schedule must be one of plateau, cosine"),
        ({"warmup_epochs": 15}, "warmup_epochs must be in [0, epochs=15)"),
        ({"warm_start_finetune_epochs": -1}, "warm_start_finetune_epochs must be 0 (off) or"),
        (
            {"warm_start_finetune_epochs": 1, "warm_start": "last-blessed"},
            "warm_start_finetune_epochs needs lr_schedule = cosine",
        ),
        ({"warm_start_finetune_learning_rate": -1.0}, "warm_start_finetune_learning_rate must"),
        ({"label_smoothing": 1.0}, "label_smoothing must be in [0, 1)"),
        ({"test_time_augment": "crop"}, "test_time_augment must be one of off, flip"),
        ({"precision": "float16"}, "precision must be one of float32, mixed_bfloat16, auto"),
    ],
)
def test_bad_settings_are_named(overrides, message):
    # luigi.cfg's fine-tune does not stop a run with warm start off, whatever its schedule.
    TrainConfig(data_dir="d", train_dir="t", epochs=1, warm_start_finetune_epochs=1).check()
    with pytest.raises(
        ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
    ):
        TrainConfig(data_dir="d", train_dir="t", **overrides).check()


@pytest.fixture
def float32_policy_after():
    """Puts Keras's global dtype policy back for the tests after this one."""
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("test_time_augment", ["off", "flip"])
def test_mixed_bfloat16_computes_in_bfloat16_with_float32_weights_and_probabilities(
    tmp_path, float32_policy_after, test_time_augment
):
    images = np.random.default_rng(1).integers(0, 256, [8, 28, 28, 1]).astype(np.float32)
    reference = models.for_inference(models.build("cnn3", [28, 28, 1], 10), test_time_augment)
    mixed_core = models.build("cnn3", [28, 28, 1], 10, "mixed_bfloat16")
    mixed = models.for_inference(mixed_core, test_time_augment)
    mixed.set_weights(reference.get_weights())
    convolutions = [layer for layer in mixed_core.layers if "conv" in layer.name]
    assert convolutions and all(layer.compute_dtype == "bfloat16" for layer in convolutions)
    assert {v.dtype for v in mixed.variables} == {tf.float32}
    out = mixed(images).numpy()
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-6)
    expected = reference(images).numpy()
    assert not np.array_equal(out, expected)  # rounded to bfloat16 on the way
    np.testing.assert_allclose(out, expected, atol=0.05)
    # The exported file keeps the policy: evaluate scores what validation scored.
    path = str(tmp_path / "model.keras")
    mixed.save(path)
    keras.mixed_precision.set_global_policy("float32")
    np.testing.assert_array_equal(keras.models.load_model(path)(images).numpy(), out)


def test_auto_precision_is_bfloat16_only_where_the_cpu_has_amx_bf16(tmp_path):
    auto = TrainConfig(data_dir="d", train_dir="t", precision="auto")
    amx = frozenset({"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})
    assert auto.resolved(amx).precision == "mixed_bfloat16"
    assert auto.resolved(frozenset({"avx2", "fma"})).precision == "float32"
    assert auto.resolved(frozenset({"avx512f", "avx512_bf16"})).precision == "float32"
    assert auto.resolved(amx).model == auto.model  # nothing else changes
    chosen = TrainConfig(data_dir="d", train_dir="t", precision="float32")
    assert chosen.resolved(amx) is chosen  # a chosen policy stays
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\n\nprocessor\t: 1\n")
    assert read_cpu_flags(str(cpuinfo)) == {"fpu", "avx2", "amx_bf16"}
    assert read_cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_test_time_flips_average_the_image_and_its_mirror_and_load_without_custom_objects(
    tmp_path,
):
    core = models.build("cnn3", [28, 28, 1], 10)
    exported = models.for_inference(core, "flip")
    images = np.random.default_rng(0).integers(0, 256, [4, 28, 28, 1]).astype(np.float32)
    expected = (core(images).numpy() + core(images[:, :, ::-1]).numpy()) / 2
    np.testing.assert_array_equal(exported(images).numpy(), expected)
    assert not np.array_equal(core(images).numpy(), expected)  # the mirror changes the output
    assert exported.trainable_weights == core.trainable_weights  # the same, trained weights
    path = str(tmp_path / "model.keras")
    exported.save(path)
    np.testing.assert_array_equal(keras.models.load_model(path)(images).numpy(), expected)
    assert models.for_inference(core, "off") is core
