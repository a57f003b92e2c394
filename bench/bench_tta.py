"""Time to accuracy: the Train stage with 2 workers vs a plain single-process Keras script.

Both train the same model (`cnn`, the old default, then `cnn2` and `cnn3`, and `cnn3` computing
in bfloat16 as the nightly does on a CPU with AMX-BF16: one row each; `--models` takes
`name` or `name:precision`) on the same 54,000 Fashion-MNIST training images (global batch
512, Adam at the shipped learning rate) and are timed from their process's start until the
first epoch whose validation accuracy (the same 6,000 held-out images) reaches TARGET. The
plain script is what a user would write: numpy arrays into `model.fit(validation_data=...)`,
one process using both cores. The stage is `python -m train launch --num-workers 2
--threads-per-worker 1`, timed to the epoch line it prints; it is stopped there.

Crossing the target is one draw: an epoch either side of it moves the time by a whole
epoch. So each row's notes also give both sides' epochs (end time and validation accuracy),
and the stage's time to the epoch at which the plain script crossed, whatever its accuracy
there: the same training, the draw aside.

`python -m bench tta` runs it alone (about 15-30 minutes on a 2-core machine).
"""

from __future__ import annotations

import json
import os
import signal
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
)
from bench.result import Result

TARGET = 0.91  # validation accuracy
MAX_EPOCHS = 20
PER_WORKER = 27000  # 2 workers: 54k train examples, as preprocess leaves them by default
NUM_VALIDATION = 6000
GLOBAL_BATCH = 512
LEARNING_RATE = 0.003
GOAL = 1 / 1.15  # the stage within 1.15x of the plain script's time


MODELS = ("cnn", "cnn2", "cnn3", "cnn3:mixed_bfloat16")


def model_and_precision(spec: str) -> tuple[str, str]:
    """`cnn3` -> ("cnn3", "float32"); `cnn3:mixed_bfloat16` -> ("cnn3", "mixed_bfloat16")."""
    name, _, precision = spec.partition(":")
    return name, precision or "float32"


# One side's epochs up to the target: (seconds since its process started, validation accuracy).
Curve = list[tuple[float, float]]


def plain_keras_seconds_to_target(
    model_spec: str,
    per_worker: int = PER_WORKER,
    target: float = TARGET,
    max_epochs: int = MAX_EPOCHS,
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
    }
    argv = [sys.executable, "-m", "train", "launch"]
    for name, value in settings.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
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
            results += _rows(
                model_spec, data_dir, tmp, per_worker, target, max_epochs, plain_kernels
            )
    return results


def _reached(curve: Curve, target: float) -> tuple[float, int]:
    """(seconds, epoch) of the first epoch at `target` in `curve`."""
    return next((t, i + 1) for i, (t, a) in enumerate(curve) if a >= target)


def _epochs_text(curve: Curve) -> str:
    return ", ".join(f"{t:.0f} s {a:.4f}" for t, a in curve)


def _rows(
    model_spec: str,
    data_dir: str,
    tmp: str,
    per_worker: int,
    target: float,
    max_epochs: int,
    plain_kernels: list[tuple[str, str]],
) -> list[Result]:
    """One row per plain-script kernel setting, all against one timed Train stage run."""
    plain: list[Curve] = []
    for onednn, _ in plain_kernels:
        argv = [sys.executable, "-m", "bench.bench_tta", model_spec]
        argv += [str(per_worker), str(target), str(max_epochs)]
        env = stage_env(2, onednn)
        out = subprocess.run(
            argv, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, check=True
        ).stdout
        plain.append([(t, a) for t, a in json.loads(out.strip().splitlines()[-1])])
    model_name, precision = model_and_precision(model_spec)
    stage = stage_seconds_to_target(
        model_spec,
        data_dir,
        os.path.join(tmp, f"t-{model_name}-{precision}"),
        target,
        max_epochs,
        min_epochs=max(len(curve) for curve in plain),
    )
    stage_seconds, stage_epochs = _reached(stage, target)
    rows = []
    for curve, (_, kernels) in zip(plain, plain_kernels, strict=True):
        plain_seconds, plain_epochs = _reached(curve, target)
        same_epochs = stage[plain_epochs - 1][0]
        rows.append(
            Result(
                benchmark=f"time to {target} validation accuracy ({model_name}, {precision}, "
                f"{2 * per_worker:,} train, global batch {GLOBAL_BATCH})",
                candidate="Train stage, 2 workers x 1 thread",
                baseline=f"plain Keras script, 1 process x 2 threads ({kernels})",
                candidate_value=stage_seconds,
                baseline_value=plain_seconds,
                unit="s",
                target_ratio=GOAL,
                higher_is_better=False,
                notes=(
                    f"stage reached it at epoch {stage_epochs} in {stage_seconds:.0f} s, the "
                    f"plain script at epoch {plain_epochs} in {plain_seconds:.0f} s; to the "
                    f"end of epoch {plain_epochs} the stage took {same_epochs:.0f} s "
                    f"({same_epochs / plain_seconds:.2f}x the plain script's time); epochs "
                    f"(end, validation accuracy): stage {_epochs_text(stage)}; plain "
                    f"{_epochs_text(curve)}; both timed from process start (imports, data "
                    "loading, cluster start-up included); no augmentation, constant "
                    "learning rate on both sides"
                ),
            )
        )
    return rows


if __name__ == "__main__":
    model_arg, per_worker_arg, target_arg, max_epochs_arg = sys.argv[1:5]
    print(
        json.dumps(
            plain_keras_seconds_to_target(
                model_arg, int(per_worker_arg), float(target_arg), int(max_epochs_arg)
            )
        )
    )
