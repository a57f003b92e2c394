"""Preprocess at 70k, 610k and 6M examples (fashion_mnist_scaled x1, x10, x100): time and memory.

Each factor's dataset is built once into .cache/tensorflow_datasets (its build time and peak
RSS are noted when this run builds it), then the stage runs as `python -m preprocess run` in a
fresh process per runner while a sampler reads the resident memory (RSS) of every process
involved every 0.2 s: the stage's process tree, and the processes of a runner's cluster when
it has one. Rows compare each factor with the next smaller one measured in the same run, per
runner: wall time per example (target: within 1.2x, linear) and the peak RSS of the largest
Beam worker process (target: within 1.3x, flat). RSS counts pages
shared between processes in each of them, so the total overstates what the machine used.

`python -m bench scale --factors 1,10` is the quick run; `make bench` runs 1, 10 and 100
(6,010,000 examples at x100; its build alone takes about 14 minutes and 3.3 GB of disk here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

import psutil

from bench.result import Result
from bench.shard_sets import FASHION_MNIST_DIR, PROJECT_ROOT

DATA_DIR = str(PROJECT_ROOT / ".cache" / "tensorflow_datasets")
DEFAULT_FACTORS = (1, 10, 100)
NUM_WORKERS = 2
SAMPLE_SECONDS = 0.2
TIME_TARGET = 1.2  # per-example time at the larger size within 1.2x of the smaller
RSS_TARGET = 1.3  # peak RSS per worker at the larger size within 1.3x of the smaller
RUNNERS = ("direct", "dask")
RUNNER_LABELS = {
    "direct": "DirectRunner (in-process FnApiRunner)",
    "dask": f"DaskRunner, {NUM_WORKERS} local workers",
}
MB = 1 << 20


def dataset_name(factor: int) -> str:
    return f"fashion_mnist_scaled/x{factor}"


def _env() -> dict[str, str]:
    return os.environ | {
        "TF_USE_LEGACY_KERAS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": str(PROJECT_ROOT),
    }


class MemorySampler:
    """Samples the RSS of a changing set of processes in a thread; keeps per-process peaks.

    `watched()` returns {pid: role}; a pid's children (recursively) are watched with the same
    role. Roles name what a process is ('stage', 'worker', 'scheduler').
    """

    def __init__(self, watched: Callable[[], dict[int, str]]):
        self._watched = watched
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.peak_by_pid: dict[int, tuple[str, int]] = {}
        self.peak_total = 0

    def _sample(self) -> None:
        total = 0
        for pid, role in self._watched().items():
            try:
                root = psutil.Process(pid)
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            for i, process in enumerate(tree):
                try:
                    rss = process.memory_info().rss
                except psutil.Error:
                    continue
                # A worker's children are workers; a stage's children are Beam's SDK workers.
                kind = role if i == 0 or role != "stage" else "worker"
                total += rss
                _, peak = self.peak_by_pid.get(process.pid, (kind, 0))
                self.peak_by_pid[process.pid] = (kind, max(peak, rss))
        self.peak_total = max(self.peak_total, total)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(SAMPLE_SECONDS)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self, kind: str) -> int:
        """The largest peak RSS of one process of this kind (0 when there was none)."""
        return max((rss for k, rss in self.peak_by_pid.values() if k == kind), default=0)

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.peak_by_pid.values() if k == kind)


@dataclasses.dataclass
class Measurement:
    """One stage run: examples written, wall seconds and peak RSS in bytes."""

    examples: int
    seconds: float
    worker_rss: int
    stage_rss: int
    total_rss: int
    workers_seen: int

    @property
    def us_per_example(self) -> float:
        return self.seconds / self.examples * 1e6


def _run_watched(
    argv: list[str], extra: Callable[[], dict[int, str]]
) -> tuple[float, MemorySampler]:
    """Runs a command to completion under a MemorySampler; returns (seconds, sampler)."""
    started = time.perf_counter()
    process = subprocess.Popen(
        argv,
        cwd=PROJECT_ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    with MemorySampler(lambda: {process.pid: "stage", **extra()}) as sampler:
        output, _ = process.communicate()
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])} ... failed:\n{output[-3000:]}")
    return seconds, sampler


def ensure_dataset(factor: int) -> str:
    """Builds fashion_mnist_scaled/x<factor> unless it is there; returns a note on the build."""
    code = (
        "import sys\nfrom preprocess import sources\n"
        "b = sources.prepare_dataset(sys.argv[1], sys.argv[2], sys.argv[3])\n"
        "print(b.info.splits['train'].num_examples)\n"
    )
    folder = os.path.join(DATA_DIR, "fashion_mnist_scaled", f"x{factor}")
    already = os.path.isdir(folder) and any(
        os.path.exists(os.path.join(folder, v, "dataset_info.json")) for v in os.listdir(folder)
    )
    seconds, sampler = _run_watched(
        [sys.executable, "-c", code, dataset_name(factor), DATA_DIR, str(FASHION_MNIST_DIR)],
        dict,
    )
    if already:
        return f"x{factor} dataset reused from {DATA_DIR}"
    return (
        f"x{factor} dataset built in {seconds:.0f} s, peak RSS {sampler.peak('stage') / MB:.0f} MB"
    )


@contextlib.contextmanager
def _no_cluster() -> Iterator[tuple[list[str], Callable[[], dict[int, str]]]]:
    # The pipeline's default. Not --direct_running_mode=multi_processing: with apache-beam
    # 2.77 it lost 2-7% of 600,000 records here (the stage's count check refused the set).
    yield ["--runner=DirectRunner"], dict


@contextlib.contextmanager
def _dask_cluster() -> Iterator[tuple[list[str], Callable[[], dict[int, str]]]]:
    from preprocess import dask_cluster

    with tempfile.TemporaryDirectory(prefix="bench-dask-") as state_dir:
        state = dask_cluster.start(workers=NUM_WORKERS, state_dir=state_dir)
        try:
            processes = {state["scheduler_pid"]: "scheduler"}
            processes |= {pid: "worker" for pid in state["worker_pids"]}
            yield (
                [
                    "--runner=DaskRunner",
                    f"--dask_client_address={state['address']}",
                ],
                lambda: processes,
            )
        finally:
            dask_cluster.stop(state_dir)


CLUSTERS = {"direct": _no_cluster, "dask": _dask_cluster}


def measure(factor: int, runner: str) -> Measurement:
    """Runs the stage once on x<factor> with `runner`, in a fresh process (and cluster)."""
    with (
        tempfile.TemporaryDirectory(prefix=f"bench-scale-x{factor}-") as out,
        CLUSTERS[runner]() as (beam_args, cluster_processes),
    ):
        seconds, sampler = _run_watched(
            [
                sys.executable,
                "-m",
                "preprocess",
                "run",
                f"--output_root={out}",
                "--date=2026-01-01",
                f"--dataset={dataset_name(factor)}",
                f"--data_dir={DATA_DIR}",
                f"--num_workers={NUM_WORKERS}",
                *beam_args,
            ],
            cluster_processes,
        )
        with open(os.path.join(out, "2026-01-01", "data", "manifest.json")) as f:
            doc = json.load(f)
    workers = sampler.count("worker")
    return Measurement(
        examples=sum(int(entry["num_examples"]) for entry in doc["files"]),
        seconds=seconds,
        # The in-process FnApiRunner has no worker processes: the stage process is the worker.
        worker_rss=sampler.peak("worker") if workers else sampler.peak("stage"),
        stage_rss=sampler.peak("stage"),
        total_rss=sampler.peak_total,
        workers_seen=workers,
    )


def _rows(runner: str, small: int, large: int, a: Measurement, b: Measurement) -> list[Result]:
    label = RUNNER_LABELS[runner]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    sizes = f"x{large} ({b.examples:,} examples) vs x{small} ({a.examples:,})"
    return [
        Result(
            benchmark=f"preprocess time per example, {sizes}",
            candidate=f"{label}, x{large}",
            baseline=f"{label}, x{small}",
            candidate_value=b.us_per_example,
            baseline_value=a.us_per_example,
            unit="us/example",
            target_ratio=1 / TIME_TARGET,
            higher_is_better=False,
            notes=(
                f"{label}: x{large} {b.seconds:.0f} s, x{small} {a.seconds:.0f} s wall for the "
                f"whole `python -m preprocess run` (start-up included); target: within "
                f"{TIME_TARGET}x (linear); load average {load}"
            ),
        ),
        Result(
            benchmark=f"preprocess peak RSS per worker, {sizes}",
            candidate=f"{label}, x{large}",
            baseline=f"{label}, x{small}",
            candidate_value=b.worker_rss / MB,
            baseline_value=a.worker_rss / MB,
            unit="MB",
            target_ratio=1 / RSS_TARGET,
            higher_is_better=False,
            notes=(
                f"{label}: largest worker process x{large} {b.worker_rss / MB:.0f} MB, "
                f"x{small} {a.worker_rss / MB:.0f} MB ({b.workers_seen} worker processes seen); "
                f"stage process {b.stage_rss / MB:.0f} / {a.stage_rss / MB:.0f} MB; total of "
                f"all processes {b.total_rss / MB:.0f} / {a.total_rss / MB:.0f} MB; target: "
                f"within {RSS_TARGET}x (flat)"
            ),
        ),
    ]


def run(
    factors: tuple[int, ...] = DEFAULT_FACTORS, runners: tuple[str, ...] = RUNNERS
) -> list[Result]:
    """Measures every runner at every factor; rows compare consecutive factors."""
    factors = tuple(sorted(set(factors)))
    if len(factors) < 2:
        raise ValueError(f"the scale bench compares sizes: give two factors or more, not {factors}")
    unknown = set(runners) - set(RUNNERS)
    if unknown:
        raise ValueError(f"unknown runners {sorted(unknown)}: pick from {', '.join(RUNNERS)}")
    builds = [ensure_dataset(f) for f in factors]
    results: list[Result] = []
    for runner in runners:
        measured = {}
        for factor in factors:
            print(f"  scale: x{factor} with {runner} ...", file=sys.stderr, flush=True)
            measured[factor] = measure(factor, runner)
        done = sorted(measured)
        for small, large in zip(done, done[1:], strict=False):
            results += _rows(runner, small, large, measured[small], measured[large])
    if results:
        results[0] = dataclasses.replace(
            results[0], notes=results[0].notes + "; " + "; ".join(builds)
        )
    return results
