"""Small nights in a row: stages forked from one warm fork server vs each a process of its own.

`python -m pipeline.simulate` runs the same few fault-free nights (small daily drops, the
`mlp`, one worker, every check after each night) with its fork server (contract.forkserver,
the default) and with `--own-processes`, alternating. Measured: the CPU seconds of the whole
simulation (every night's Luigi, stages, workers and checks, and the fork server, from the
kernel's account of reaped children) and its wall time. The candidate imports TensorFlow and
Beam once instead of in each stage of each night.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from bench.result import Result
from bench.shard_sets import PROJECT_ROOT

NIGHTS = 3
REPEATS = 1
TARGET = 1.3  # CPU seconds: about a third of a small night is importing TensorFlow and Beam
SETTINGS = ("--faults", "none", "--per-day", "200", "--epochs", "1", "--no-tmpfs")


def _simulate(root: str, fork_server: bool, nights: int) -> tuple[float, float]:
    """One simulation to completion: (CPU seconds of its whole tree, wall seconds)."""
    argv = [sys.executable, "-m", "pipeline.simulate", "--nights", str(nights), "--root", root]
    argv += [*SETTINGS, *(() if fork_server else ("--own-processes",))]
    env = {k: v for k, v in os.environ.items() if k != "PIPELINE_FORKSERVER"}
    env |= {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"bench_nights: the simulation failed: {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def run(repeats: int = REPEATS, nights: int = NIGHTS) -> list[Result]:
    measured: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="bench-nights-") as tmp:
        for repeat in range(repeats):
            for fork_server in (False, True):
                root = os.path.join(tmp, f"sim-{repeat}-{int(fork_server)}")
                measured[fork_server].append(_simulate(root, fork_server, nights))
    cpu = {key: statistics.median(c for c, _ in runs) for key, runs in measured.items()}
    wall = {key: statistics.median(w for _, w in runs) for key, runs in measured.items()}
    notes = (
        f"{nights} fault-free simulated nights (`python -m pipeline.simulate {' '.join(SETTINGS)}"
        f"`), every check after each; medians of {repeats} simulations each, alternating; wall "
        f"{wall[True]:.1f} s with the fork server vs {wall[False]:.1f} s "
        f"({wall[False] / wall[True]:.2f}x)"
    )
    return [
        Result(
            benchmark="nights: CPU of small nights in a row",
            candidate="fork server (default)",
            baseline="--own-processes",
            candidate_value=cpu[True],
            baseline_value=cpu[False],
            unit="CPU-s",
            target_ratio=TARGET,
            higher_is_better=False,
            notes=notes,
        )
    ]
