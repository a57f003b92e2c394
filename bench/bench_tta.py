"""Time to accuracy: the Train stage with 2 workers vs a plain single-process Keras script.

Both train the same model (`cnn`, the old default, then `cnn2` and `cnn3`, and `cnn3` computing
in bfloat16 as the nightly does on a CPU with AMX-BF16: one row each; `--models` takes
`name` or `name:precision`) on the same 54,000 Fashion-MNIST training images (global batch
512, Adam at the shipped learning rate) and are timed from their process's start until the
first epoch whose validation accuracy (the same 6,000 held-out images) reaches TARGET. The
plain script is what a user would write: numpy arrays into `model.fit(validation_data=...)`,
one process using both cores. The stage is `python -m train launch --num-workers 2
--threads-per-worker 1`, timed to the epoch line it prints; it is stopped there.

`python -m bench tta` runs it alone (about 15-30 minutes on a 2-core machine).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

from bench.bench_train import (
    PROJECT_ROOT,
    STAGE_KERNELS,
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
_PROCESS_START = time.perf_counter()  # the plain script's clock starts with its process


MODELS = ("cnn", "cnn2", "cnn3", "cnn3:mixed_bfloat16")


def model_and_precision(spec: str) -> tuple[str, str]:
    """`cnn3` -> ("cnn3", "float32"); `cnn3:mixed_bfloat16` -> ("cnn3", "mixed_bfloat16")."""
    name, _, precision = spec.partition(":")
    return name, precision or "float32"


def plain_keras_seconds_to_target(
    model_spec: str,
    per_worker: int = PER_WORKER,
    target: float = TARGET,
    max_epochs: int = MAX_EPOCHS,
) -> tuple[float, int]:
    """In this process: the user's script. Returns (seconds to `target`, epochs it took)."""
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    from bench.shard_sets import fashion_mnist_arrays
    from train import models

    started = _PROCESS_START
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
    reached: list[tuple[float, int]] = []

    class StopAtTarget(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            if (logs or {}).get("val_accuracy", 0.0) >= target:
                reached.append((time.perf_counter() - started, epoch + 1))
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
    if not reached:
        raise RuntimeError(f"the plain script never reached {target} in {max_epochs} epochs")
    return reached[0]


def stage_seconds_to_target(
    model_spec: str,
    data_dir: str,
    train_dir: str,
    target: float = TARGET,
    max_epochs: int = MAX_EPOCHS,
) -> tuple[float, int]:
    """The Train stage, 2 workers x 1 thread, timed to its first epoch line at `target`."""
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
    try:
        assert process.stdout is not None
        for line in process.stdout:
            progress = parse_progress(line.strip())
            if progress and progress.get("val_accuracy", 0.0) >= target:
                return time.perf_counter() - started, int(progress["epoch"])
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
            results += _rows(
                model_spec, data_dir, tmp, per_worker, target, max_epochs, plain_kernels
            )
    return results


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
    plain = []
    for onednn, _ in plain_kernels:
        argv = [sys.executable, "-m", "bench.bench_tta", model_spec]
        argv += [str(per_worker), str(target), str(max_epochs)]
        env = stage_env(2, onednn)
        out = subprocess.run(
            argv, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        plain.append((float(out[-2]), int(out[-1])))
    model_name, precision = model_and_precision(model_spec)
    stage_seconds, stage_epochs = stage_seconds_to_target(
        model_spec, data_dir, os.path.join(tmp, f"t-{model_name}-{precision}"), target, max_epochs
    )
    return [
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
                f"stage reached it at epoch {stage_epochs} in {stage_seconds:.0f} s, the plain "
                f"script at epoch {plain_epochs} in {plain_seconds:.0f} s; both timed from "
                "process start (imports, data loading, cluster start-up included); no "
                "augmentation, constant learning rate on both sides"
            ),
        )
        for (plain_seconds, plain_epochs), (_, kernels) in zip(plain, plain_kernels, strict=True)
    ]


if __name__ == "__main__":
    model_arg, per_worker_arg, target_arg, max_epochs_arg = sys.argv[1:5]
    seconds, epochs = plain_keras_seconds_to_target(
        model_arg, int(per_worker_arg), float(target_arg), int(max_epochs_arg)
    )
    print(f"{seconds} {epochs}")
