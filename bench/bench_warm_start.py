"""Warm start: a night's time to the previous night's test accuracy, warm-started vs cold.

Night 1 trains cold on the first N1 Fashion-MNIST training images for NIGHT1_EPOCHS epochs,
choosing its best epoch on a validation split of its own (the next training images), and is
blessed: a latest pointer names its model.keras and sha256, as evaluate writes it. The target
is what Evaluate reports for that model: its accuracy on all 10,000 Fashion-MNIST test images,
a set it was never chosen on. Night 2's data has grown to the first N2 training images and its
validation split is the whole test set, so every epoch's validation accuracy is that test
accuracy. On it the Train stage (2 workers x 1 thread) runs cold, then with `--warm-start
last-blessed` at each of the recipe's warm settings (or `--warm-rates` x `--warm-finetunes`:
its `--warm-start-learning-rate` and `--warm-start-finetune-epochs`), each stopped at the first
epoch whose test accuracy reaches night 1's. One row per warm setting: the training time (from
the chief's first step to that epoch's line) of the cold night over the warm night's; goal:
warm <= 0.35x cold, so a ratio >= 2.86. The notes give the times from process start too,
where start-up (about 45 s on a loaded 2-core machine) weighs on both.

The default is cheap (`cnn` on 6,000 then 10,000 images at a constant rate, about 7 minutes
on 2 cores); `--recipe nightly` runs luigi.cfg's recipe (cnn3, cosine with a warm-up epoch,
flip-shift, label smoothing, 0.006, 35 epochs) on 27,000 then 54,000 images; `--sizes` and
`--model` change the nights' sizes and the model (`python -m bench warm_start --recipe
nightly --sizes 27000,54000`).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.bench_train import PROJECT_ROOT, stage_env, train_argv
from bench.result import Result

NUM_TEST = 10000  # all of Fashion-MNIST's test images
NUM_NIGHT1_VALIDATION = 2000
GLOBAL_BATCH = 512
NIGHT1_EPOCHS = 10
MAX_EPOCHS = 15
GOAL = 1 / 0.35  # warm within 0.35x of cold's time
RECIPES: dict[str, dict[str, Any]] = {
    # A constant rate: what the row measures is the starting point, not the schedule.
    "plain": {
        "model": "cnn",
        "sizes": (6000, 10000),
        "settings": {"learning_rate": 0.003, "lr_schedule": "plateau"},
        # (warm_start_learning_rate, warm_start_finetune_epochs), one row each
        "warm": ((0.003, 0), (0.001, 0), (0.0003, 0)),
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
        # luigi.cfg's (the full rate after a fine-tune epoch), and the full rate without it.
        "warm": ((0.006, 1), (0.006, 0)),
        "epochs": 35,
    },
}


@dataclasses.dataclass
class Night:
    """One Train stage's run: when training began and each epoch ended (seconds since its
    process started), each epoch's test accuracy, and the stage's notices."""

    training_began: float = 0.0
    curve: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    notices: list[str] = dataclasses.field(default_factory=list)

    @property
    def wall_seconds(self) -> float:
        """From the process's start to the last epoch's line."""
        return self.curve[-1][0]

    @property
    def training_seconds(self) -> float:
        """From the chief's first step (its START line) to the last epoch's line."""
        return self.curve[-1][0] - self.training_began


def night(settings: dict[str, Any], target: float | None) -> Night:
    """Runs the Train stage with `settings`, timed per epoch line; stopped at the first epoch
    at `target` (run to its end when None)."""
    from contract.messages import parse_notice, parse_progress

    argv = train_argv("launch", settings)
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
    run = Night()
    try:
        assert process.stdout is not None and process.stderr is not None
        for line in process.stdout:
            now = time.perf_counter() - started
            notice = parse_notice(line.strip())
            if notice is not None:
                run.notices.append(notice)
            if " START initial_epoch=" in line and not run.training_began:
                run.training_began = now
            progress = parse_progress(line.strip())
            if not progress:
                continue
            run.curve.append((now, float(progress["val_accuracy"])))
            if target is not None and run.curve[-1][1] >= target:
                return run
        code = process.wait()
        if target is None and code == 0:
            return run
        last = (process.stderr.read().strip().splitlines() or ["no output"])[-1]
        best = max((a for _, a in run.curve), default=0.0)
        raise RuntimeError(
            f"bench_warm_start: the Train stage ended (exit {code}) before {target} test "
            f"accuracy, best {best:.4f}: {last}"
        )
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def model_path_of(root: str, date: str) -> str:
    """That night's model.keras."""
    from contract import layout

    return layout.join(layout.train_dir(root, date), layout.MODEL_FILE)


def bless(root: str, date: str, accuracy: float) -> None:
    """Points `<root>/latest.json` at that night's model, as evaluate does."""
    from contract import atomic, layout, pointer

    model_path = model_path_of(root, date)
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


def test_accuracy(model_path: str, data_dir: str) -> float:
    """What Evaluate reports for the model: its accuracy on the shard set's whole eval split."""
    from contract import manifest
    from evaluate import data, scoring
    from evaluate.stage import load_model

    doc = manifest.read_manifest(data_dir)
    labels, probabilities = scoring.predict_split(
        load_model(model_path), data.eval_dataset(data_dir, doc, 500)
    )
    if labels.shape[0] != NUM_TEST:
        raise RuntimeError(f"bench_warm_start: scored {labels.shape[0]} test images, not all")
    return float(scoring.score(labels, probabilities, list(doc["class_names"]))["accuracy"])


def run(
    recipe: str = "plain",
    sizes: tuple[int, ...] | None = None,
    model: str | None = None,
    warm_rates: tuple[float, ...] | None = None,
    warm_finetunes: tuple[int, ...] | None = None,
) -> list[Result]:
    from bench.shard_sets import write_shard_set
    from contract import layout

    chosen = RECIPES[recipe]
    if sizes is not None and (len(sizes) != 2 or not 0 < sizes[0] < sizes[1]):
        raise ValueError(f"--sizes takes night 1's and a larger night 2's size, got {sizes}")
    first, second = sizes or chosen["sizes"]
    model = model or chosen["model"]
    variants = list(chosen["warm"])
    if warm_rates or warm_finetunes:
        rates = warm_rates or tuple(dict.fromkeys(rate for rate, _ in variants))
        variants = [(rate, finetune) for rate in rates for finetune in warm_finetunes or (0,)]
    epochs = chosen.get("epochs", MAX_EPOCHS)
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as tmp:
        root = os.path.join(tmp, "runs")
        night1_data = os.path.join(tmp, "data-night1")
        night2_data = os.path.join(tmp, "data-night2")
        write_shard_set(
            night1_data,
            num_workers=2,
            per_worker=first // 2,
            num_validation=NUM_NIGHT1_VALIDATION,  # the training images after night 1's
            num_eval=NUM_TEST,
        )
        write_shard_set(
            night2_data,
            num_workers=2,
            per_worker=second // 2,
            num_validation=NUM_TEST,
            num_eval=NUM_TEST,
            validate_on_test=True,
        )

        def settings(data_dir: str, train_dir: str, **extra: Any) -> dict[str, Any]:
            return {
                "data_dir": data_dir,
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
        night(settings(night1_data, night1_dir, epochs=min(epochs, NIGHT1_EPOCHS)), None)
        model_path = model_path_of(root, "2026-01-01")
        target = test_accuracy(model_path, night1_data)
        bless(root, "2026-01-01", target)
        print(f"bench_warm_start: night 1's test accuracy {target:.4f}", file=sys.stderr)
        cold = night(settings(night2_data, os.path.join(tmp, "cold", "train")), target)
        results = []
        for index, (rate, finetune) in enumerate(variants):
            warm_dir = layout.train_dir(root, f"2026-01-{index + 2:02d}")
            extra = {"warm_start_learning_rate": rate, "warm_start_finetune_epochs": finetune}
            warm = night(
                settings(night2_data, warm_dir, warm_start="last-blessed", **extra), target
            )
            if not any(n.startswith("warm start from") for n in warm.notices):
                raise RuntimeError(f"bench_warm_start: the warm night started cold: {warm.notices}")
            results.append(_row(model, recipe, first, second, target, rate, finetune, warm, cold))
        print(f"bench_warm_start: night 1's model {model_path}", file=sys.stderr)
    return results


def _row(
    model: str,
    recipe: str,
    first: int,
    second: int,
    target: float,
    rate: float,
    finetune: int,
    warm: Night,
    cold: Night,
) -> Result:
    def accuracies(run: Night) -> str:
        return ", ".join(f"{a:.4f}" for _, a in run.curve)

    setting = f"rate {rate:g}" + (f" after {finetune} fine-tune epoch(s)" if finetune else "")
    return Result(
        benchmark=f"training time to night 1's test accuracy {target:.4f} on night 2's data "
        f"({model}, {recipe} recipe, {first:,} then {second:,} train images, {NUM_TEST:,} test)",
        candidate=f"warm start from night 1's model, {setting}",
        baseline="cold start",
        candidate_value=warm.training_seconds,
        baseline_value=cold.training_seconds,
        unit="s",
        target_ratio=GOAL,
        higher_is_better=False,
        notes=(
            f"warm {setting}: warm/cold {warm.training_seconds / cold.training_seconds:.2f}x "
            "in training time (from the chief's first step to the epoch at the target, "
            f"validation included); from process start (imports, cluster start-up, the warm "
            f"start's check and load) {warm.wall_seconds:.0f} s warm, {cold.wall_seconds:.0f} s "
            f"cold, {warm.wall_seconds / cold.wall_seconds:.2f}x; epochs to the target: warm "
            f"{len(warm.curve)}, cold {len(cold.curve)}; test accuracy by epoch: warm "
            f"{accuracies(warm)}; cold {accuracies(cold)}"
        ),
    )
