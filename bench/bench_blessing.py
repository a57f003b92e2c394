"""How often each blessing rule blesses a candidate that is truly worse, and rejects an equal one.

A real model (`mlp`, trained for a few epochs on Fashion-MNIST's train split, seeded) is scored
on the 10,000-image test split; that is the baseline. Candidates are made from its predictions,
a fresh seeded draw each time: first 3 % of the examples churn (as many of its right answers
are made wrong as wrong answers right, as two models of equal accuracy disagree), then a fixed
share of its right answers is made wrong: 0 (equal), 0.5 or 1.5 points. Each draw then takes
an eval set of 500, 2,000 or all 10,000 examples (subsampled without replacement) and applies
both rules with max_regression 0.01:

- the point rule: candidate accuracy - baseline accuracy >= -0.01 on that eval set;
- the paired rule (evaluate.paired): the lower end of the 95 % paired bootstrap interval of
  the difference >= -0.01.

A candidate 1.5 points worse is truly worse than max_regression: blessing it is a false bless.
The goal is a paired false-bless rate of at most 5 % at every size. The table goes to
bench/results/blessing.md and standard error; the false-bless rates are also this module's
results.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time

import numpy as np

from bench.result import Result
from evaluate import paired

DRAWS = 200
SIZES = (500, 2000, 10_000)
WORSE_BY = (0.0, 0.005, 0.015)
CHURN = 0.03
MAX_REGRESSION = 0.01
CONFIDENCE = 0.95
EPOCHS = 3
SEED = 0
FASHION_MNIST_DIR = pathlib.Path(".cache/fashion-mnist")
RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "blessing.md"


def _baseline_correct() -> tuple[np.ndarray, float]:
    """Whether a real, seeded `mlp` gets each Fashion-MNIST test image right; its test accuracy."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    from preprocess.scaled_dataset import read_idx
    from train import models

    def split(images: str, labels: str) -> tuple[np.ndarray, np.ndarray]:
        x = read_idx(str(FASHION_MNIST_DIR / images))[..., np.newaxis].astype(np.float32)
        return x, read_idx(str(FASHION_MNIST_DIR / labels)).astype(np.int64)

    train_x, train_y = split("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
    test_x, test_y = split("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
    tf.keras.utils.set_random_seed(SEED)
    model = models.build("mlp", [28, 28, 1], 10)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(train_x, train_y, batch_size=256, epochs=EPOCHS, verbose=0)
    correct = model.predict(test_x, batch_size=1000, verbose=0).argmax(axis=1) == test_y
    return correct, float(correct.mean())


def _candidate(baseline: np.ndarray, worse_by: float, rng: np.random.Generator) -> np.ndarray:
    """The baseline's correctness with churn, then `worse_by` of the examples made wrong."""
    n = baseline.shape[0]
    right = np.flatnonzero(baseline)
    wrong = np.flatnonzero(~baseline)
    churn = round(CHURN * n)
    drop = round(worse_by * n)
    lost = rng.choice(right, size=churn + drop, replace=False)
    gained = rng.choice(wrong, size=churn, replace=False)
    candidate = baseline.copy()
    candidate[lost] = False
    candidate[gained] = True
    return candidate


def _rates(baseline: np.ndarray) -> dict[tuple[int, float], tuple[float, float]]:
    """(size, worse_by) -> (point rule's bless rate, paired rule's bless rate) over DRAWS."""
    rates = {}
    for worse_by in WORSE_BY:
        for size in SIZES:
            rng = np.random.default_rng([SEED, size, round(worse_by * 1000)])
            point = paired_blessed = 0
            for draw in range(DRAWS):
                candidate = _candidate(baseline, worse_by, rng)
                index = rng.choice(baseline.shape[0], size=size, replace=False)
                c, b = candidate[index], baseline[index]
                point += c.mean() - b.mean() >= -MAX_REGRESSION - 1e-9
                comparison = paired.compare(c, b, confidence=CONFIDENCE, seed=draw)
                paired_blessed += comparison.lower >= -MAX_REGRESSION - 1e-9
            rates[(size, worse_by)] = (point / DRAWS, paired_blessed / DRAWS)
    return rates


def _markdown(rates: dict[tuple[int, float], tuple[float, float]], accuracy: float) -> str:
    lines = [
        f"Baseline: `mlp`, {EPOCHS} epochs, test accuracy {accuracy:.4f}; {DRAWS} draws per "
        f"cell; churn {CHURN:.0%}; max_regression {MAX_REGRESSION}; interval {CONFIDENCE:.0%}.",
        "",
        "| eval size | candidate | truly | point rule blesses | paired rule blesses |",
        "|---|---|---|---|---|",
    ]
    for worse_by in WORSE_BY:
        truth = "worse than max_regression" if worse_by > MAX_REGRESSION else "within it"
        name = "equal" if worse_by == 0 else f"{worse_by * 100:.1f} points worse"
        for size in SIZES:
            point, paired_rate = rates[(size, worse_by)]
            lines.append(f"| {size:,} | {name} | {truth} | {point:.1%} | {paired_rate:.1%} |")
    return "\n".join(lines) + "\n"


def run() -> list[Result]:
    baseline, accuracy = _baseline_correct()
    started = time.perf_counter()
    rng = np.random.default_rng(SEED)
    paired.compare(_candidate(baseline, 0.0, rng), baseline, confidence=CONFIDENCE)
    compare_ms = (time.perf_counter() - started) * 1000
    rates = _rates(baseline)
    text = _markdown(rates, accuracy)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(text)
    print(text, file=sys.stderr)
    return [
        Result(
            benchmark=f"blessing: rejects a 1.5-point-worse candidate, eval size {size:,}",
            candidate="paired rule",
            baseline="point rule",
            candidate_value=100 * (1 - rates[(size, max(WORSE_BY))][1]),
            baseline_value=100 * (1 - rates[(size, max(WORSE_BY))][0]),
            unit="%",
            target_ratio=1.0,
            notes=(
                f"{DRAWS} draws; paired false-bless rate {rates[(size, max(WORSE_BY))][1]:.1%} "
                f"(goal <= 5 %); one paired comparison of 10,000 examples took "
                f"{compare_ms:.1f} ms"
            ),
        )
        for size in SIZES
    ]
