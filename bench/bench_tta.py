"""Time to accuracy: the Train stage with 2 workers vs a plain single-process Keras script.

Both train the same model (by default the nightly's: `cnn3` in the precision `--precision
auto` picks on this CPU; `--models` takes `name` or `name:precision`, one row each, e.g.
`cnn,cnn3:float32,cnn3:mixed_bfloat16`) on the same 54,000 Fashion-MNIST training images
(global batch 512, Adam at the shipped learning rate) and are timed from their process's start
until the first epoch whose validation accuracy (the same 6,000 held-out images) reaches
TARGET. The plain script is what a user would write: numpy arrays into
`model.fit(validation_data=...)`, one process using both cores. The stage is `python -m
train launch --num-workers 2 --threads-per-worker 1`, timed to the epoch line it prints; it is
stopped there.

Crossing the target is one draw: an epoch either side of it moves the time by a whole
epoch. So each side runs once per seed (`--seeds N`, seeds 0..N-1: the stage's `--seed`, and
`keras.utils.set_random_seed` in the plain script, which a user may leave out), alternating
plain and stage so a drift in the machine's speed reaches both, and the row compares the
median times. Its notes give each side's epochs at the target per seed, the mean validation
accuracy per epoch over the seeds (does one side learn more per epoch?), and the stage's
median time to the epoch at which the plain script crossed, whatever its accuracy there: the
same training, the draw aside.

`python -m bench tta` runs it alone (about 2.5 minutes per seed and model on a 2-core
machine, 15 with the default 5 seeds; more where TensorFlow's own kernels are not oneDNN).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from bench.bench_train import (
    PROJECT_ROOT,
    STAGE_KERNELS,
    bfloat16_measurable,
    stage_env,
    tf_own_kernels,
    tf_own_setting,
    train_argv,
)
from bench.result import Result

TARGET = 0.91  # validation accuracy
MAX_EPOCHS = 20
PER_WORKER = 27000  # 2 workers: 54k train examples, as preprocess leaves them by default
NUM_VALIDATION = 6000
GLOBAL_BATCH = 512
LEARNING_RATE = 0.003
GOAL = 1 / 1.15  # the stage within 1.15x of the plain script's time
SEEDS = 5  # the plain script crossed at epochs 2 to 6 over five seeds: one draw says little


MODELS = ("cnn3:auto",)  # the nightly's model and precision


def model_and_precision(spec: str) -> tuple[str, str]:
    """`cnn3` -> ("cnn3", "float32"); `cnn3:mixed_bfloat16` -> ("cnn3", "mixed_bfloat16");
    `cnn3:auto` -> the precision the stage's "auto" picks on this CPU (float32 under the
    AVX2 cap: an AVX2-only CPU has no AMX)."""
    from train.config import auto_precision

    name, _, precision = spec.partition(":")
    if precision == "auto":
        precision = auto_precision() if bfloat16_measurable() else "float32"
    return name, precision or "float32"


# One side's epochs up to the target: (seconds since its process started, validation accuracy).
Curve = list[tuple[float, float]]


def plain_keras_seconds_to_target(
    model_spec: str,
    per_worker: int = PER_WORKER,
    target: float = TARGET,
    max_epochs: int = MAX_EPOCHS,
    seed: int = 0,
) -> Curve:
    """In this process: the user's script, timed per epoch until one reaches `target`."""
    import numpy as np
    import psutil
    import tensorflow as tf
    import tf_keras as keras

    from bench.shard_sets import fashion_mnist_arrays
    from train import models

    # The clock starts with the process, as the stage's does: imports (TensorFlow's among
    # them, pulled in before this module's body runs) are part of the user's wait.
    started_at = psutil.Process().create_time()
    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    keras.utils.set_random_seed(seed)  # the weights' initial draw and fit's shuffling
    images, labels = fashion_mnist_arrays("train", 2 * per_worker + NUM_VALIDATION)
    images = images.astype(np.float32)
    train_x, val_x = images[: 2 * per_worker], images[2 * per_worker :]
    train_y, val_y = labels[: 2 * per_worker], labels[2 * per_worker :]
    model_name, precision = model_and_precision(model_spec)
    model = models.build(model_name, [28, 28, 1], 10, precision)
    model.compile(
        optimizer=keras.optimizers.Adam(LEARNING_RATE),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    curve: Curve = []

    class StopAtTarget(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            accuracy = float((logs or {}).get("val_accuracy", 0.0))
            curve.append((time.time() - started_at, accuracy))
            if accuracy >= target:
                self.model.stop_training = True

    model.fit(
        train_x,
        train_y,
        batch_size=GLOBAL_BATCH,
        epochs=max_epochs,
        validation_data=(val_x, val_y),
        callbacks=[StopAtTarget()],
        verbose=0,
    )
    if not curve or curve[-1][1] < target:
        raise RuntimeError(f"the plain script never reached {target} in {max_epochs} epochs")
    return curve


def stage_seconds_to_target(
    model_spec: str,
    data_dir: str,
    train_dir: str,
    target: float = TARGET,
    max_epochs: int = MAX_EPOCHS,
    min_epochs: int = 1,
    seed: int = 0,
) -> Curve:
    """The Train stage, 2 workers x 1 thread, timed per epoch line until one at `target`.

    It runs on to `min_epochs` if it gets there sooner, so that its time to the plain
    script's epoch count is known too.
    """
    from contract.messages import parse_progress

    model_name, precision = model_and_precision(model_spec)
    settings = {
        "data_dir": data_dir,
        "train_dir": train_dir,
        "model": model_name,
        "precision": precision,
        "epochs": max_epochs,
        "per_worker_batch_size": GLOBAL_BATCH // 2,
        "learning_rate": LEARNING_RATE,
        "threads_per_worker": 1,
        "early_stopping_patience": 0,
        "reduce_lr_patience": 0,
        "num_workers": 2,
        "max_restarts": 0,
        "seed": seed,
    }
    argv = train_argv("launch", settings)
    started = time.perf_counter()
    process = subprocess.Popen(
        argv,
        cwd=PROJECT_ROOT,
        env=stage_env(1),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # stopped with its workers at the target
    )
    curve: Curve = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            progress = parse_progress(line.strip())
            if not progress:
                continue
            curve.append((time.perf_counter() - started, float(progress.get("val_accuracy", 0.0))))
            if max(a for _, a in curve) >= target and len(curve) >= min_epochs:
                return curve
        raise RuntimeError(f"the Train stage never reached {target} (exit {process.wait()})")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def run(
    per_worker: int = PER_WORKER,
    target: float = TARGET,
    max_epochs: int = MAX_EPOCHS,
    models: tuple[str, ...] = MODELS,
    seeds: int = SEEDS,
) -> list[Result]:
    from bench.shard_sets import write_shard_set

    results = []
    with tempfile.TemporaryDirectory(prefix="bench-tta-") as tmp:
        data_dir = os.path.join(tmp, "data")
        write_shard_set(
            data_dir, num_workers=2, per_worker=per_worker, num_validation=NUM_VALIDATION
        )
        # The plain script as a user runs it, on the kernels TensorFlow picks by itself; where
        # that is not oneDNN (the stage's), once more on oneDNN: the same arithmetic both sides.
        own = tf_own_kernels()
        plain_kernels = [(tf_own_setting(), f"TensorFlow's own kernels, {own} here")]
        if own != "oneDNN":
            plain_kernels.append((STAGE_KERNELS, "TF_ENABLE_ONEDNN_OPTS=1, as the stage"))
        for model_spec in models:
            if model_and_precision(model_spec)[1] == "mixed_bfloat16" and not (
                bfloat16_measurable()
            ):
                print(f"bench_tta: {model_spec} left out under the AVX2 cap", file=sys.stderr)
                continue
            plain, stage = _curves(
                model_spec, data_dir, tmp, per_worker, target, max_epochs, plain_kernels, seeds
            )
            for curves, (_, kernels) in zip(plain, plain_kernels, strict=True):
                results.append(_row(model_spec, per_worker, target, kernels, curves, stage))
    return results


def _plain_curve(
    model_spec: str, per_worker: int, target: float, max_epochs: int, onednn: str, seed: int
) -> Curve:
    """The plain script in a process of its own (its clock starts with it)."""
    argv = [sys.executable, "-m", "bench.bench_tta", model_spec]
    argv += [str(per_worker), str(target), str(max_epochs), str(seed)]
    out = subprocess.run(
        argv, cwd=PROJECT_ROOT, env=stage_env(2, onednn), capture_output=True, text=True
    )
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"bench_tta: the plain script failed: {last}")
    return [(t, a) for t, a in json.loads(out.stdout.strip().splitlines()[-1])]


def _curves(
    model_spec: str,
    data_dir: str,
    tmp: str,
    per_worker: int,
    target: float,
    max_epochs: int,
    plain_kernels: list[tuple[str, str]],
    seeds: int,
) -> tuple[list[list[Curve]], list[Curve]]:
    """Per seed, the plain script on each kernel setting, then the stage: plain[setting][seed]
    and stage[seed]. The stage runs on to the plain script's epoch count for that seed."""
    plain: list[list[Curve]] = [[] for _ in plain_kernels]
    stage: list[Curve] = []
    model_name, precision = model_and_precision(model_spec)
    for seed in range(seeds):
        for curves, (onednn, _) in zip(plain, plain_kernels, strict=True):
            curves.append(_plain_curve(model_spec, per_worker, target, max_epochs, onednn, seed))
        stage.append(
            stage_seconds_to_target(
                model_spec,
                data_dir,
                os.path.join(tmp, f"t-{model_name}-{precision}-{seed}"),
                target,
                max_epochs,
                min_epochs=max(len(curves[seed]) for curves in plain),
                seed=seed,
            )
        )
    return plain, stage


def _reached(curve: Curve, target: float) -> tuple[float, int]:
    """(seconds, epoch) of the first epoch at `target` in `curve`."""
    for epoch, (seconds, accuracy) in enumerate(curve, start=1):
        if accuracy >= target:
            return seconds, epoch
    best = max((accuracy for _, accuracy in curve), default=0.0)
    raise RuntimeError(
        f"bench_tta: no epoch reached {target} validation accuracy (epochs run: {len(curve)}, "
        f"best {best:.4f}); lower the target or raise max_epochs"
    )


def _mean_accuracies(curves: list[Curve]) -> str:
    """Mean validation accuracy per epoch, over the epochs every curve has."""
    epochs = min(len(curve) for curve in curves)
    means = [statistics.fmean(curve[i][1] for curve in curves) for i in range(epochs)]
    return ", ".join(f"{a:.4f}" for a in means)


def _row(
    model_spec: str,
    per_worker: int,
    target: float,
    kernels: str,
    plain: list[Curve],
    stage: list[Curve],
) -> Result:
    """One plain-script kernel setting against the stage, medians over the seeds."""
    model_name, precision = model_and_precision(model_spec)
    stage_reached = [_reached(curve, target) for curve in stage]
    plain_reached = [_reached(curve, target) for curve in plain]
    stage_seconds = statistics.median(t for t, _ in stage_reached)
    plain_seconds = statistics.median(t for t, _ in plain_reached)
    # The stage's time to the epoch at which the plain script with the same seed crossed.
    same_epochs = statistics.median(
        curve[epochs - 1][0] for curve, (_, epochs) in zip(stage, plain_reached, strict=True)
    )
    return Result(
        benchmark=f"time to {target} validation accuracy ({model_name}, {precision}, "
        f"{2 * per_worker:,} train, global batch {GLOBAL_BATCH}, median of {len(stage)} "
        f"seed{'s' if len(stage) > 1 else ''})",
        candidate="Train stage, 2 workers x 1 thread",
        baseline=f"plain Keras script, 1 process x 2 threads ({kernels})",
        candidate_value=stage_seconds,
        baseline_value=plain_seconds,
        unit="s",
        target_ratio=GOAL,
        higher_is_better=False,
        notes=(
            "epoch and seconds at the target by seed: stage "
            + ", ".join(f"{e} ({t:.0f} s)" for t, e in stage_reached)
            + "; plain "
            + ", ".join(f"{e} ({t:.0f} s)" for t, e in plain_reached)
            + f"; to the end of the plain script's epoch at the target the stage took "
            f"{same_epochs:.0f} s (median; {same_epochs / plain_seconds:.2f}x the plain "
            f"script's median); mean validation accuracy by epoch: stage "
            f"{_mean_accuracies(stage)}; plain {_mean_accuracies(plain)}; both timed from "
            "process start (imports, data loading, cluster start-up included); no "
            "augmentation, constant learning rate on both sides"
        ),
    )


if __name__ == "__main__":
    model_arg, per_worker_arg, target_arg, max_epochs_arg, seed_arg = sys.argv[1:6]
    print(
        json.dumps(
            plain_keras_seconds_to_target(
                model_arg,
                int(per_worker_arg),
                float(target_arg),
                int(max_epochs_arg),
                int(seed_arg),
            )
        )
    )
