"""Where a training step's time goes, and its achieved FLOP/s against this machine's matmul peak.

Measured in one process with every core (TensorFlow's default thread pools), seeded with op
determinism on as the Train stage runs, on random float32 images of the default dataset's
shape, so the input pipeline is timed on its own; once for the old default `cnn`, then
`cnn2` and `cnn3`, and `cnn3` again computing in bfloat16 (the nightly's `precision = auto` on
a CPU with AMX-BF16):

- peak: a 1024x1024 matmul loop in the step's compute type (float32, or bfloat16 for the
  mixed_bfloat16 row), the most this CPU does through TensorFlow;
- the model's FLOPs per example, counted by layer arithmetic (Conv2D and Dense multiply-adds;
  batch norm, pooling and activations are left out, well under 1 % of the total); a training
  step is counted as 3x the forward pass (forward, gradient with respect to activations and
  with respect to weights);
- per-step times of: input (parse + batch of the real shard files, with the recipe's
  augmentation), forward, forward+backward,
  + optimizer apply (a bare tf.function step), and a `model.fit` step (Keras's own overhead).

The all-reduce is timed on its own: two processes (MultiWorkerMirroredStrategy from TF_CONFIG
on loopback, ring, one thread each, as the Train stage runs them) sum a float32 vector as long
as the model's trainable weights, the one collective `train.trainer` makes per step.

Run alone: `python -m bench profile`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from bench.result import Result

MATMUL_N = 1024
MATMUL_SECONDS = 3.0
BATCH = 256
# The old default (no augmentation), then cnn2 and cnn3 with the augmentation of their recipe,
# in float32 and in mixed bfloat16: (model, augment, precision).
RECIPES = (
    ("cnn", "off", "float32"),
    ("cnn2", "flip-shift", "float32"),
    ("cnn3", "flip-shift", "float32"),
    ("cnn3", "flip-shift", "mixed_bfloat16"),
)
# The matmul type whose peak a step computing under a dtype policy is held against.
MATMUL_DTYPE = {"float32": "float32", "mixed_bfloat16": "bfloat16"}
IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
WARMUP_STEPS = 10
TIMED_STEPS = 40


def matmul_peak_flops(dtype: str = "float32") -> float:
    """FLOP/s of a square matmul loop in `dtype` (best of three timed windows)."""
    import tensorflow as tf

    a = tf.cast(tf.random.normal([MATMUL_N, MATMUL_N]), dtype)
    b = tf.cast(tf.random.normal([MATMUL_N, MATMUL_N]), dtype)

    @tf.function
    def ten_matmuls(x: tf.Tensor) -> tf.Tensor:
        for _ in range(10):
            x = tf.matmul(x, b) * 1e-3
        return x

    ten_matmuls(a).numpy()
    best = 0.0
    for _ in range(3):
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < MATMUL_SECONDS / 3:
            ten_matmuls(a).numpy()
            count += 10
        best = max(best, 2 * MATMUL_N**3 * count / (time.perf_counter() - started))
    return best


def forward_flops_per_example(model: Any) -> float:
    """Multiply-add FLOPs (2 per MAC) of one example's forward pass through Conv2D and Dense."""
    import tf_keras as keras

    total = 0.0
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            _, height, width, filters = layer.output.shape
            kh, kw = layer.kernel_size
            channels_in = layer.input.shape[-1]
            total += 2.0 * height * width * filters * kh * kw * channels_in
        elif isinstance(layer, keras.layers.Dense):
            total += 2.0 * layer.input.shape[-1] * layer.units
    return total


def _seconds_per_call(fn: Callable[[], Any], steps: int = TIMED_STEPS) -> float:
    for _ in range(WARMUP_STEPS):
        fn()
    started = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - started) / steps


def step_breakdown(model_name: str, augment: str, precision: str = "float32") -> dict[str, float]:
    """Seconds per step of each part of training one batch of BATCH examples."""
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    from train import determinism, models

    determinism.make_deterministic(0)  # as the Train stage runs: seeded, deterministic ops
    model = models.build(model_name, IMAGE_SHAPE, NUM_CLASSES, precision)
    optimizer = keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    rng = np.random.default_rng(0)
    x = tf.constant(rng.integers(0, 256, (BATCH, *IMAGE_SHAPE)).astype("float32"))
    y = tf.constant(rng.integers(0, NUM_CLASSES, BATCH))

    @tf.function
    def forward() -> tf.Tensor:
        return loss_fn(y, model(x, training=True))

    @tf.function
    def forward_backward() -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        # One number out, as from the other steps: copying every gradient out would be timed.
        grads = tape.gradient(loss, model.trainable_variables)
        return tf.add_n([tf.reduce_sum(g) for g in grads])

    @tf.function
    def train_step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    times = {
        "forward": _seconds_per_call(lambda: forward().numpy()),
        "forward+backward": _seconds_per_call(lambda: forward_backward().numpy()),
        "train step": _seconds_per_call(lambda: train_step().numpy()),
    }
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss_fn, metrics=["accuracy"])
    dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
    model.fit(dataset, steps_per_epoch=WARMUP_STEPS, epochs=1, verbose=0)
    started = time.perf_counter()
    model.fit(dataset, steps_per_epoch=TIMED_STEPS, epochs=1, verbose=0)
    times["fit step"] = (time.perf_counter() - started) / TIMED_STEPS
    times["input"] = _input_seconds_per_batch(augment)
    times["forward_flops_per_example"] = forward_flops_per_example(model)
    times["weights"] = float(sum(int(tf.size(w)) for w in model.trainable_weights))
    return times


def _input_seconds_per_batch(augment: str) -> float:
    """Seconds per batch of train.data's pipeline over one worker's shard of random images.

    Parsing costs the same for any pixel values, so random bytes time it as well as real ones.
    """
    import tempfile

    import numpy as np
    import tensorflow as tf

    from contract import layout, records
    from train import data

    examples = BATCH * 20
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        relative = layout.worker_file_name(0, 1, 0, 1)
        os.makedirs(os.path.dirname(os.path.join(tmp, relative)))
        with tf.io.TFRecordWriter(os.path.join(tmp, relative)) as writer:
            for _ in range(examples):
                image = rng.integers(0, 256, IMAGE_SHAPE, dtype=np.uint8)
                writer.write(records.encode_example(image, int(rng.integers(NUM_CLASSES))))
        shard_manifest = {
            "num_workers": 1,
            "image_shape": list(IMAGE_SHAPE),
            "splits": {"train": {"examples_per_worker": examples}},
            "files": [
                {
                    "path": relative,
                    "split": "train",
                    "worker": 0,
                    "size_bytes": os.path.getsize(os.path.join(tmp, relative)),
                    "num_examples": examples,
                }
            ],
        }
        iterator = iter(data.train_dataset(tmp, shard_manifest, 0, BATCH, 1, augment=augment))
        return _seconds_per_call(lambda: next(iterator))


ALL_REDUCE_STEPS = 50


def all_reduce_seconds(num_floats: int) -> float:
    """Seconds per all-reduce of `num_floats` float32 between two local MWMS processes."""
    import json
    import subprocess
    import sys

    from bench.bench_train import PROJECT_ROOT, stage_env
    from train.local_backend import free_ports

    hosts = [f"127.0.0.1:{port}" for port in free_ports(2)]
    processes = []
    for index in range(2):
        config = {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": index}}
        env = {**stage_env(1), "TF_CONFIG": json.dumps(config)}
        argv = [sys.executable, "-m", "bench.bench_profile", "all-reduce", str(num_floats)]
        processes.append(
            subprocess.Popen(argv, cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, text=True)
        )
    outputs = [p.communicate(timeout=300)[0] for p in processes]
    if any(p.returncode for p in processes):
        raise RuntimeError(f"all-reduce processes failed: {[p.returncode for p in processes]}")
    return float(outputs[0].split()[-1])


def _all_reduce_worker(num_floats: int) -> None:
    """One of the two processes of `all_reduce_seconds`: prints seconds per all-reduce."""
    import tensorflow as tf

    from train import cluster

    cluster.configure_threads(1)
    strategy = cluster.make_strategy()
    vector = tf.ones([num_floats])

    @tf.function
    def all_reduce_once() -> tf.Tensor:
        def step() -> tf.Tensor:
            context = tf.distribute.get_replica_context()
            return context.all_reduce(tf.distribute.ReduceOp.SUM, vector)[0]

        return strategy.run(step)

    for _ in range(WARMUP_STEPS):
        all_reduce_once().numpy()
    started = time.perf_counter()
    for _ in range(ALL_REDUCE_STEPS):
        all_reduce_once().numpy()
    print((time.perf_counter() - started) / ALL_REDUCE_STEPS)


def run() -> list[Result]:
    import sys

    from bench.bench_train import bfloat16_measurable

    recipes = [r for r in RECIPES if bfloat16_measurable() or r[2] != "mixed_bfloat16"]
    if len(recipes) < len(RECIPES):
        print("bench_profile: bfloat16 left out under the AVX2 cap", file=sys.stderr)
    dtypes = sorted({MATMUL_DTYPE[precision] for _, _, precision in recipes})
    peaks = {dtype: matmul_peak_flops(dtype) for dtype in dtypes}
    return [
        _profile_row(name, augment, precision, peaks[MATMUL_DTYPE[precision]])
        for name, augment, precision in recipes
    ]


def _profile_row(model_name: str, augment: str, precision: str, peak: float) -> Result:
    times = step_breakdown(model_name, augment, precision)
    flops_per_step = 3 * times["forward_flops_per_example"] * BATCH
    achieved = flops_per_step / times["fit step"]
    bare = flops_per_step / times["train step"]
    forward = times["forward"]
    backward = times["forward+backward"] - forward
    apply = times["train step"] - times["forward+backward"]
    keras_overhead = times["fit step"] - times["train step"]
    all_reduce = all_reduce_seconds(int(times["weights"]))
    breakdown = (
        f"per step of {BATCH}: input {times['input'] * 1e3:.1f} ms (augment {augment}; "
        "tf.data's own threads, overlaps), "
        f"forward {forward * 1e3:.1f} ms, backward {backward * 1e3:.1f} ms, "
        f"optimizer {apply * 1e3:.1f} ms, Keras fit overhead {keras_overhead * 1e3:.1f} ms; "
        f"2-worker all-reduce of its {times['weights']:,.0f} weights {all_reduce * 1e3:.1f} ms "
        "(timed alone, 1 thread per process); "
        f"fit step {times['fit step'] * 1e3:.1f} ms = {BATCH / times['fit step']:,.0f} "
        f"examples/s; {times['forward_flops_per_example'] / 1e6:.1f} MFLOP forward per "
        f"example; bare step {bare / 1e9:.1f} GFLOP/s; peak {peak / 1e9:.1f} GFLOP/s "
        f"({MATMUL_N}x{MATMUL_N} {MATMUL_DTYPE[precision]} matmul)"
    )
    return Result(
        benchmark=f"training FLOP/s vs matmul peak ({model_name}, {precision}, batch {BATCH}, "
        "1 process)",
        candidate="model.fit step",
        baseline=f"{MATMUL_DTYPE[precision]} matmul loop",
        candidate_value=achieved / 1e9,
        baseline_value=peak / 1e9,
        unit="GFLOP/s",
        target_ratio=0.5,
        notes=breakdown,
    )


if __name__ == "__main__":
    import sys

    if sys.argv[1] == "all-reduce":
        _all_reduce_worker(int(sys.argv[2]))
