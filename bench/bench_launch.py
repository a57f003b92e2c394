"""A small local cluster's launch: workers forked from one process vs each started on its own.

The same two-worker run of the `mlp` on a small shard set (one epoch, then a cluster restart
after worker 1 is killed mid-epoch), launched with the default forker (train/forker.py) and
with `TRAIN_FORK_WORKERS=0`, alternating, several times each. Measured: the whole launch's CPU
seconds (launcher and every process under it, from the kernel's account of reaped children)
and its wall time. The candidate saves TensorFlow's import in all but one process per launch.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import tempfile
import time

from bench.bench_train import PROJECT_ROOT, stage_env, train_argv
from bench.result import Result

PER_WORKER = 256
NUM_VALIDATION = 203
REPEATS = 3
TARGET = 1.3  # CPU seconds: two workers and a restart import TensorFlow once instead of 4 times
SETTINGS = {
    "model": "mlp",
    "epochs": 2,
    "per_worker_batch_size": 16,
    "save_freq_steps": 5,
    "early_stopping_patience": 0,
}
KILL_AT = "1:20"  # worker 1, inside the second epoch: the cluster restarts from its backup


def _launch(data_dir: str, train_dir: str, fork: bool) -> tuple[float, float]:
    """One launch to completion: (CPU seconds of the launch's whole tree, wall seconds)."""
    settings = {**SETTINGS, "data_dir": data_dir, "train_dir": train_dir, "num_workers": 2}
    env = stage_env(1) | {
        "TRAIN_FORK_WORKERS": "1" if fork else "0",
        "TRAIN_FAULT_KILL_AT_STEP": KILL_AT,
    }
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        train_argv("launch", settings), cwd=PROJECT_ROOT, env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or "worker 1 died" not in done.stdout:
        raise RuntimeError(f"bench_launch: the launch failed: {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def run(repeats: int = REPEATS) -> list[Result]:
    from bench.shard_sets import write_shard_set

    measured: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp:
        data_dir = os.path.join(tmp, "data")
        write_shard_set(
            data_dir, num_workers=2, per_worker=PER_WORKER, num_validation=NUM_VALIDATION
        )
        for repeat in range(repeats):
            for fork in (False, True):
                train_dir = os.path.join(tmp, f"train-{repeat}-{int(fork)}")
                measured[fork].append(_launch(data_dir, train_dir, fork))
    cpu = {fork: statistics.median(c for c, _ in runs) for fork, runs in measured.items()}
    wall = {fork: statistics.median(w for _, w in runs) for fork, runs in measured.items()}
    notes = (
        f"2 workers, {SETTINGS['model']}, {SETTINGS['epochs']} epochs of {PER_WORKER} examples "
        f"each, worker 1 killed at step {KILL_AT.split(':')[1]} and the cluster restarted; "
        f"medians of {repeats} launches each, alternating; wall {wall[True]:.1f} s forked vs "
        f"{wall[False]:.1f} s ({wall[False] / wall[True]:.2f}x)"
    )
    return [
        Result(
            benchmark="launch: CPU of a small launch with a restart",
            candidate="workers forked (default)",
            baseline="TRAIN_FORK_WORKERS=0",
            candidate_value=cpu[True],
            baseline_value=cpu[False],
            unit="CPU-s",
            target_ratio=TARGET,
            higher_is_better=False,
            notes=notes,
        )
    ]
