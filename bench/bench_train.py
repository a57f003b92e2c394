"""Train-stage benchmarks: shard input vs in-memory, two workers vs one process, pre-sharding.

Each candidate and its baseline run in the same invocation on a shard set written here from
the real Fashion-MNIST images (bench.shard_sets), so the ratios hold on the measuring machine.
Training throughputs come from separate processes (thread pools are fixed per process).
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench.result import Result
from train.config import auto_precision

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PER_WORKER = 15000  # two workers: 30k train examples
NUM_VALIDATION = 2000
BATCH = 128  # per worker
INPUT_STEPS = 300
WARMUP_STEPS = 130  # one pass over a worker's 15k examples: cache and shuffle buffer full
READ_PASSES = 10
Recipe = dict[str, str | int | float]  # Train flags, and the global batch


def nightly_recipe() -> Recipe:
    """luigi.cfg's [Train] section: the nightly's settings that differ from the defaults."""
    config = configparser.ConfigParser()
    config.read(os.path.join(PROJECT_ROOT, "luigi.cfg"))
    return {name: value for name, value in config["Train"].items()}


# The nightly run's training recipe (256 per worker, two workers, precision auto: bfloat16 on a
# CPU with AMX-BF16), the same in float32, and the one it replaced (cnn without augmentation,
# 256 per worker, a backup every 100 steps).
DEFAULT: Recipe = {**nightly_recipe(), "global_batch": 512}
DEFAULT_FLOAT32: Recipe = {**DEFAULT, "precision": "float32"}
OLD_DEFAULT: Recipe = {
    "model": "cnn",
    "augment": "off",
    "lr_schedule": "plateau",
    "warmup_epochs": 0,
    "save_freq_steps": 100,
    "global_batch": 512,
}


# TF_ENABLE_ONEDNN_OPTS: "1", the stage's default (train/__init__.py), or TensorFlow's own
# choice, as it was before: oneDNN only on CPUs with AVX512-VNNI, AVX-VNNI, AVX512-BF16 or
# AMX, Eigen elsewhere.
STAGE_KERNELS = "1"
# The setting that stands for TensorFlow's own choice: empty, or "0" (Eigen) under
# `python -m bench --cpu avx2`, which stands in for an AVX2-only CPU (bench/__main__.py).
OWN_KERNELS_ENV = "BENCH_TF_OWN_KERNELS"


# ONEDNN_MAX_CPU_ISA caps under which oneDNN has no bfloat16 kernels. TensorFlow routes bfloat16
# ops by the CPU's own features, not by the cap, so under `--cpu avx2` on a CPU with AVX-512 it
# hands them to oneDNN, which refuses, and the process aborts; on a real AVX2-only CPU they run
# (slowly). Such runs leave bfloat16 out.
NO_BFLOAT16_ISAS = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI"})


def bfloat16_measurable() -> bool:
    """False where oneDNN is capped below bfloat16 (an emulated AVX2-only CPU)."""
    return os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() not in NO_BFLOAT16_ISAS


def tf_own_setting() -> str:
    """TF_ENABLE_ONEDNN_OPTS as TensorFlow's own choice on the measured (or emulated) CPU."""
    return os.environ.get(OWN_KERNELS_ENV, "")


def stage_env(threads: int, onednn: str = STAGE_KERNELS) -> dict[str, str]:
    """The environment of a stage or benchmark subprocess using `threads` OpenMP threads."""
    return {
        **os.environ,
        "TF_USE_LEGACY_KERAS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": PROJECT_ROOT,
        "OMP_NUM_THREADS": str(threads),
        "TF_ENABLE_ONEDNN_OPTS": onednn,
    }


def train_argv(command: str, settings: dict[str, Any]) -> list[str]:
    """`python -m train <command>` with `settings` as its flags."""
    argv = [sys.executable, "-m", "train", command]
    for name, value in settings.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def tf_own_kernels() -> str:
    """The CPU kernels TensorFlow picks by itself on this machine: "oneDNN" or "Eigen"."""
    out = subprocess.run(
        [sys.executable, "-c", "from train import cluster; print(cluster.kernel_library())"],
        cwd=PROJECT_ROOT,
        env=stage_env(1, tf_own_setting()),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.strip().splitlines()[-1]


def _measure(kind: str, data_dir: str) -> float:
    """Runs `python -m bench.bench_train <kind> <data_dir>` and returns the number it prints."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.bench_train", kind, data_dir],
        cwd=PROJECT_ROOT,
        env=stage_env(2),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(out.strip().splitlines()[-1])


def _fit_rate(dataset, steps: int) -> float:
    """Examples per second of `fit` on `dataset` for `steps` steps, after a warm-up pass."""
    import tf_keras as keras

    from train import models

    model = models.build("cnn", [28, 28, 1], 10)
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", ["accuracy"])
    model.fit(dataset, steps_per_epoch=WARMUP_STEPS, epochs=1, verbose=0)
    started = time.perf_counter()
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
    return steps * BATCH / (time.perf_counter() - started)


def shard_input_rate(data_dir: str) -> float:
    """Training rate of one process on worker 0's shard files through train's input pipeline."""
    from contract import manifest
    from train import data

    shard_manifest = manifest.read_manifest(data_dir)
    return _fit_rate(data.train_dataset(data_dir, shard_manifest, 0, BATCH, seed=1), INPUT_STEPS)


def memory_input_rate(data_dir: str) -> float:
    """Training rate of the same model on the same examples held as in-memory tensors."""
    import numpy as np
    import tensorflow as tf

    from contract import manifest, records

    shard_manifest = manifest.read_manifest(data_dir)
    files = manifest.shard_paths_for_worker(data_dir, shard_manifest, 0)
    serialized = list(tf.data.TFRecordDataset(files).as_numpy_iterator())
    images, labels = records.parse_batch(tf.constant(serialized), [28, 28, 1])
    images = tf.constant(np.asarray(images, np.float32))
    dataset = (
        tf.data.Dataset.from_tensor_slices((images, labels))
        .shuffle(len(serialized), seed=1)
        .repeat()
        .batch(BATCH, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    return _fit_rate(dataset, INPUT_STEPS)


def _train_rate(
    data_dir: str,
    train_dir: str,
    num_workers: int,
    threads: int,
    recipe: Recipe,
    onednn: str = STAGE_KERNELS,
) -> float:
    """examples_per_second from history.json of a real train run (epochs 2 and 3)."""
    flags = {name: value for name, value in recipe.items() if name != "global_batch"}
    settings = {
        **flags,
        "data_dir": data_dir,
        "train_dir": train_dir,
        "epochs": 3,
        "per_worker_batch_size": int(recipe["global_batch"]) // num_workers,
        "threads_per_worker": threads,
        "early_stopping_patience": 0,
        "reduce_lr_patience": 0,
    }
    command = "launch" if num_workers > 1 else "worker"
    argv = train_argv(command, settings)
    if num_workers > 1:
        argv += ["--num-workers", str(num_workers), "--max-restarts", "0"]
    shutil.rmtree(train_dir, ignore_errors=True)
    env = stage_env(threads, onednn)
    subprocess.run(argv, cwd=PROJECT_ROOT, env=env, capture_output=True, check=True)
    with open(os.path.join(train_dir, "history.json")) as f:
        return float(json.load(f)["examples_per_second"])


def read_rate(data_dir: str, pre_sharded: bool, num_workers: int = 4) -> float:
    """Examples per second worker 0 gets: its own files, or what DATA auto-sharding gives it.

    Both read and parse as the train input pipeline does (batch, then parse). The baseline is
    what `AutoShardPolicy.DATA` does to that pipeline: every worker reads and parses the whole
    train set and keeps every `num_workers`-th element at the end. Ten passes are counted
    inside the graph, so Python's per-batch overhead does not hide the reading cost.
    """
    import tensorflow as tf

    from contract import layout, manifest, records

    shard_manifest = manifest.read_manifest(data_dir)
    if pre_sharded:
        files = manifest.shard_paths_for_worker(data_dir, shard_manifest, 0)
    else:
        files = manifest.split_paths(data_dir, shard_manifest, layout.TRAIN_SPLIT)
    dataset = tf.data.TFRecordDataset(files).repeat(READ_PASSES).batch(256)
    dataset = dataset.map(
        lambda s: records.parse_batch(s, [28, 28, 1])[1], num_parallel_calls=tf.data.AUTOTUNE
    )
    if not pre_sharded:
        dataset = dataset.shard(num_workers, 0)
    dataset = dataset.prefetch(tf.data.AUTOTUNE)
    started = time.perf_counter()
    count = int(dataset.reduce(0, lambda total, labels: total + tf.shape(labels)[0]))
    return count / (time.perf_counter() - started)


def _best_of(
    rounds: int, candidate: Callable[[], float], baseline: Callable[[], float]
) -> tuple[float, float]:
    best = [0.0, 0.0]
    for _ in range(rounds):
        best = [max(best[0], candidate()), max(best[1], baseline())]
    return best[0], best[1]


def run() -> list[Result]:
    from bench import shard_sets

    with tempfile.TemporaryDirectory(prefix="bench-train-") as root:
        two = os.path.join(root, "two")
        one = os.path.join(root, "one")
        four = os.path.join(root, "four")
        t1, t2 = os.path.join(root, "t1"), os.path.join(root, "t2")
        shard_sets.write_shard_set(two, 2, PER_WORKER, NUM_VALIDATION, 10)
        shard_sets.write_shard_set(one, 1, 2 * PER_WORKER, NUM_VALIDATION, 10)
        shard_sets.write_shard_set(four, 4, 14000, NUM_VALIDATION, 10)

        # Candidate and baseline alternate and each keeps its best, so neither side pays
        # alone for a moment when other processes take the CPU.
        shard_rate, memory_rate = _best_of(
            2, lambda: _measure("shard-input", two), lambda: _measure("memory-input", two)
        )
        # One 2-worker run of the default recipe serves both rows it is in.
        workers_rate = process_rate = old_rate = float32_rate = tf_kernels_rate = 0.0
        for _ in range(2):
            workers_rate = max(workers_rate, _train_rate(two, t2, 2, 1, DEFAULT))
            process_rate = max(process_rate, _train_rate(one, t1, 1, 2, DEFAULT))
            # The old default as it ran: with the kernels TensorFlow picks by itself.
            old_rate = max(old_rate, _train_rate(two, t2, 2, 1, OLD_DEFAULT, tf_own_setting()))
            float32_rate = max(float32_rate, _train_rate(two, t2, 2, 1, DEFAULT_FLOAT32))
            tf_kernels_rate = max(
                tf_kernels_rate, _train_rate(two, t2, 2, 1, DEFAULT, tf_own_setting())
            )
        precision = auto_precision()
        own_kernels = tf_own_kernels()
        presharded, on_the_fly = _best_of(
            3, lambda: _measure("read-presharded", four), lambda: _measure("read-shard", four)
        )
    return [
        Result(
            "train input: shard files vs in-memory tensors",
            "TFRecord shards (train.data)",
            "in-memory tensors",
            shard_rate,
            memory_rate,
            "ex/s",
            0.97,
            notes="one process, 2 threads, cnn, per-step batch 128",
        ),
        Result(
            "training: 2 MWMS workers x 1 thread vs 1 process x 2 threads",
            "2 workers x 1 thread",
            "1 process x 2 threads",
            workers_rate,
            process_rate,
            "ex/s",
            0.95,
            notes=f"the nightly default (cnn3, flip-shift, cosine, {precision} here), global "
            "batch 512, 30k examples/epoch; history.json examples_per_second (epochs 2-3, "
            "training steps only)",
        ),
        Result(
            "training examples/s of the Train stage: the nightly default vs the one it replaced",
            f"cnn3 + flip-shift + cosine, global batch 512, {precision} (default)",
            f"cnn, no augmentation, plateau, global batch 512, float32, {own_kernels} "
            "kernels (old default)",
            workers_rate,
            old_rate,
            "ex/s",
            2.0,
            notes="2 workers x 1 thread, 30k examples/epoch; history.json examples_per_second "
            "(epochs 2-3, training steps only); cnn3 does 15.2 MFLOP a forward pass, cnn 8.5; "
            "precision auto is mixed_bfloat16 only where the CPU has AMX-BF16; the old "
            "default runs the kernels TensorFlow picks by itself on this CPU, the new one "
            "oneDNN's (TF_ENABLE_ONEDNN_OPTS=1, train/__init__.py)",
        ),
        Result(
            "training examples/s of the Train stage: oneDNN kernels vs TensorFlow's own choice",
            "TF_ENABLE_ONEDNN_OPTS=1 (the stage's default)",
            f"TF_ENABLE_ONEDNN_OPTS unset: TensorFlow's choice, {own_kernels} on this CPU",
            workers_rate,
            tf_kernels_rate,
            "ex/s",
            1.0,
            notes="the nightly recipe otherwise unchanged, 2 workers x 1 thread, 30k "
            "examples/epoch; TensorFlow turns oneDNN on by itself only on CPUs with "
            "AVX512-VNNI, AVX-VNNI, AVX512-BF16 or AMX, so about 1x there",
        ),
        Result(
            "training examples/s of the Train stage: nightly precision auto vs float32",
            f"precision auto ({precision} here)",
            "precision float32",
            workers_rate,
            float32_rate,
            "ex/s",
            1.0,
            notes="the nightly recipe otherwise unchanged, 2 workers x 1 thread, 30k "
            "examples/epoch; auto is float32 where the CPU lacks AMX-BF16, so about 1x there",
        ),
        Result(
            "per-worker read rate, 4 workers: pre-sharded files vs Dataset.shard",
            "own pre-sharded files",
            "DATA auto-shard: all files, shard(4, i) at the end",
            presharded,
            on_the_fly,
            "ex/s",
            3.0,
            notes="read + parse (as train.data does) of worker 0's 14k examples, 10 passes, "
            "page cache; the baseline reads and parses all 56k and keeps its quarter, as "
            "AutoShardPolicy.DATA does",
        ),
    ]


MEASUREMENTS = {
    "shard-input": shard_input_rate,
    "memory-input": memory_input_rate,
    "read-presharded": lambda d: read_rate(d, pre_sharded=True),
    "read-shard": lambda d: read_rate(d, pre_sharded=False),
}

if __name__ == "__main__":
    from train import cluster

    cluster.configure_threads(2)
    print(MEASUREMENTS[sys.argv[1]](sys.argv[2]))
