"""Warm start: a night's time to the previous night's test accuracy, warm-started vs cold.

Night 1 trains cold on the first N1 Fashion-MNIST training images for NIGHT1_EPOCHS epochs
and is blessed: a latest pointer names its model.keras and sha256, as evaluate writes it. Its
test accuracy is its best epoch's validation accuracy, the validation split of both nights
being the first NUM_TEST Fashion-MNIST test images. Night 2's data has grown to the first N2
training images. On it the Train stage (2 workers x 1 thread) runs cold, then with
`--warm-start last-blessed` at each of `--warm-rates` (its `--warm-start-learning-rate`), each
timed from its process's start to the first epoch whose test accuracy reaches night 1's, and
stopped there. One row per warm rate; its ratio is the cold night's time over the warm
night's (goal: warm <= 0.35x cold, so the ratio >= 2.86).

The default is cheap (`cnn` on 6,000 then 10,000 images, a constant rate, about 5 minutes on
2 cores); `--recipe nightly` runs luigi.cfg's recipe (cnn3, cosine with a warm-up epoch,
flip-shift, label smoothing, 0.006, 35 epochs) on 27,000 then 54,000 images; `--sizes`
and `--model` change the nights' sizes and the model (`python -m bench warm_start --recipe
nightly --sizes 27000,54000`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.bench_train import PROJECT_ROOT, stage_env
from bench.result import Result

NUM_TEST = 2000
GLOBAL_BATCH = 512
NIGHT1_EPOCHS = 4
MAX_EPOCHS = 15
GOAL = 1 / 0.35  # warm within 0.35x of cold's time
RECIPES: dict[str, dict[str, Any]] = {
    # A constant rate: what the row measures is the starting point, not the schedule.
    "plain": {
        "model": "cnn",
        "sizes": (6000, 10000),
        "settings": {"learning_rate": 0.003, "lr_schedule": "plateau"},
        "warm_rates": (0.003, 0.001, 0.0003),
    },
    "nightly": {
        "model": "cnn3",
        "sizes": (27000, 54000),
        "settings": {
            "learning_rate": 0.006,
            "lr_schedule": "cosine",
            "warmup_epochs": 1,
            "augment": "flip-shift",
            "label_smoothing": 0.1,
            "precision": "auto",
        },
        "warm_rates": (0.006, 0.002, 0.0006),
        "epochs": 35,
    },
}
# (seconds since the process started, test accuracy) of each epoch up to the target.
Curve = list[tuple[float, float]]


def night(settings: dict[str, Any], target: float | None) -> tuple[Curve, list[str]]:
    """Runs the Train stage with `settings`, timed per epoch line; stopped at the first epoch
    at `target` (run to its end when None). Returns the curve and the stage's notices."""
    from contract.messages import parse_notice, parse_progress

    argv = [sys.executable, "-m", "train", "launch"]
    for name, value in settings.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    started = time.perf_counter()
    process = subprocess.Popen(
        argv,
        cwd=PROJECT_ROOT,
        env=stage_env(1),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # stopped with its workers at the target
    )
    curve: Curve = []
    notices: list[str] = []
    try:
        assert process.stdout is not None and process.stderr is not None
        for line in process.stdout:
            notice = parse_notice(line.strip())
            if notice is not None:
                notices.append(notice)
            progress = parse_progress(line.strip())
            if not progress:
                continue
            curve.append((time.perf_counter() - started, float(progress["val_accuracy"])))
            if target is not None and curve[-1][1] >= target:
                return curve, notices
        code = process.wait()
        if target is None and code == 0:
            return curve, notices
        last = (process.stderr.read().strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(
            f"bench_warm_start: the Train stage ended (exit {code}) before {target} test "
            f"accuracy, best {max((a for _, a in curve), default=0.0):.4f}: {last}"
        )
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def bless(root: str, date: str, accuracy: float) -> str:
    """Points `<root>/latest.json` at that night's model, as evaluate does; returns its path."""
    from contract import atomic, layout, pointer

    model_path = layout.join(layout.train_dir(root, date), layout.MODEL_FILE)
    pointer.write(
        root,
        {
            "date": date,
            "model_path": model_path,
            "model_sha256": atomic.sha256_file(model_path),
            "accuracy": accuracy,
            "loss": 0.0,
            "dataset": "fashion_mnist",
            "metrics_path": layout.join(layout.evaluate_dir(root, date), layout.METRICS_FILE),
            "updated_utc": "",
        },
    )
    return model_path


def run(
    recipe: str = "plain",
    sizes: tuple[int, ...] | None = None,
    model: str | None = None,
    warm_rates: tuple[float, ...] | None = None,
) -> list[Result]:
    from bench.shard_sets import write_shard_set
    from contract import layout

    chosen = RECIPES[recipe]
    first, second = sizes or chosen["sizes"]
    model = model or chosen["model"]
    rates = warm_rates or chosen["warm_rates"]
    epochs = chosen.get("epochs", MAX_EPOCHS)
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as tmp:
        root = os.path.join(tmp, "runs")
        data = {}
        for date, size in (("2026-01-01", first), ("2026-01-02", second)):
            data[date] = os.path.join(tmp, f"data-{date}")
            write_shard_set(
                data[date],
                num_workers=2,
                per_worker=size // 2,
                num_validation=NUM_TEST,
                validate_on_test=True,
            )

        def settings(date: str, train_dir: str, **extra: Any) -> dict[str, Any]:
            return {
                "data_dir": data[date],
                "train_dir": train_dir,
                "model": model,
                "epochs": epochs,
                "per_worker_batch_size": GLOBAL_BATCH // 2,
                "validation_batch_size": 500,
                "threads_per_worker": 1,
                "early_stopping_patience": 0,
                "reduce_lr_patience": 0,
                "num_workers": 2,
                "max_restarts": 0,
                **chosen["settings"],
                **extra,
            }

        night1_dir = layout.train_dir(root, "2026-01-01")
        night(settings("2026-01-01", night1_dir, epochs=min(epochs, NIGHT1_EPOCHS)), None)
        with open(os.path.join(night1_dir, layout.HISTORY_FILE)) as f:
            doc = json.load(f)
        target = doc["history"]["val_accuracy"][doc["best_epoch"] - 1]
        model_path = bless(root, "2026-01-01", target)
        cold, _ = night(settings("2026-01-02", os.path.join(tmp, "cold", "train")), target)
        results = []
        for index, rate in enumerate(rates):
            warm_dir = layout.train_dir(root, f"2026-01-{index + 2:02d}")
            warm, notices = night(
                settings(
                    "2026-01-02",
                    warm_dir,
                    warm_start="last-blessed",
                    warm_start_learning_rate=rate,
                ),
                target,
            )
            if not any(n.startswith("warm start from") for n in notices):
                raise RuntimeError(f"bench_warm_start: the warm night started cold: {notices}")
            results.append(_row(model, recipe, first, second, target, rate, warm, cold))
        print(f"bench_warm_start: night 1's model {model_path}", file=sys.stderr)
    return results


def _row(
    model: str,
    recipe: str,
    first: int,
    second: int,
    target: float,
    rate: float,
    warm: Curve,
    cold: Curve,
) -> Result:
    warm_seconds, cold_seconds = warm[-1][0], cold[-1][0]
    return Result(
        benchmark=f"time to night 1's test accuracy {target:.4f} on night 2's data ({model}, "
        f"{recipe} recipe, {first:,} then {second:,} train images, {NUM_TEST:,} test)",
        candidate=f"warm start from night 1's model, rate {rate:g}",
        baseline="cold start",
        candidate_value=warm_seconds,
        baseline_value=cold_seconds,
        unit="s",
        target_ratio=GOAL,
        higher_is_better=False,
        notes=(
            f"warm rate {rate:g}: warm/cold {warm_seconds / cold_seconds:.2f}x; epochs to the "
            f"target: warm {len(warm)}, cold {len(cold)}; test accuracy by epoch: warm "
            + ", ".join(f"{a:.4f}" for _, a in warm)
            + "; cold "
            + ", ".join(f"{a:.4f}" for _, a in cold)
            + "; timed from process start (imports, cluster start-up and the warm start's "
            f"load included); the first epoch ended at {warm[0][0]:.0f} s warm, "
            f"{cold[0][0]:.0f} s cold"
        ),
    )
