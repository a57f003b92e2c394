"""Training input at any size: a worker's peak memory reading a shard above its memory budget
(streamed) against reading one below it (held in memory).

Each case runs in a fresh process that reads one whole epoch of one worker's batches through
`train.data.train_dataset` and reports its peak RSS (sampled every 50 ms). Budget 32 MB: the
small shard (37,500 examples, about 30 MB) is held in memory, the large one (600,000
examples, about 490 MB, real images repeated) is streamed. A third process holds the large shard in
memory (budget 1 GB), to show what streaming saves. Target: large streamed within 1.3x of
small in memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from bench.result import Result
from bench.shard_sets import PROJECT_ROOT, write_shard_set

BUDGET_MB = 32
SMALL, LARGE = 37_500, 600_000  # 30 MB, just below the budget; 490 MB
BATCH = 256
TARGET = 1 / 1.3
MB = 1 << 20

READ_EPOCH = f"""
import json, sys, threading, time
import psutil
from contract import manifest
from train import data
# Sampled, not ru_maxrss: Linux carries ru_maxrss over exec from the parent (the bench).
peak, done = [0], threading.Event()
def sample():
    process = psutil.Process()
    while not done.wait(0.05):
        peak[0] = max(peak[0], process.memory_info().rss)
threading.Thread(target=sample, daemon=True).start()
data_dir, budget = sys.argv[1], int(sys.argv[2])
doc = manifest.read_manifest(data_dir)
plan = data.input_plan(doc, 0, {BATCH}, budget)
steps = manifest.steps_per_epoch(doc, {BATCH})
started = time.perf_counter()
for _ in data.train_dataset(data_dir, doc, 0, {BATCH}, seed=1, memory_budget_mb=budget).take(steps):
    pass
done.set()
print(json.dumps({{"rss": peak[0], "seconds": time.perf_counter() - started,
                  "plan": plan.describe()}}))
"""


def _read_epoch(data_dir: str, budget_mb: int) -> dict:
    env = os.environ | {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(PROJECT_ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", READ_EPOCH, data_dir, str(budget_mb)],
        capture_output=True, text=True, check=True, env=env, cwd=PROJECT_ROOT,
    )  # fmt: skip
    measured: dict = json.loads(out.stdout.strip().splitlines()[-1])
    return measured


def run() -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="bench-input-") as folder:
        small_dir, large_dir = os.path.join(folder, "small"), os.path.join(folder, "large")
        write_shard_set(small_dir, num_workers=1, per_worker=SMALL, num_validation=100)
        write_shard_set(large_dir, num_workers=1, per_worker=LARGE, num_validation=100,
                        source_images=60_000)  # fmt: skip
        small = _read_epoch(small_dir, BUDGET_MB)
        streamed = _read_epoch(large_dir, BUDGET_MB)
        held = _read_epoch(large_dir, 1024)
    assert small["plan"] == "memory" and streamed["plan"].startswith("stream"), (small, streamed)
    return [
        Result(
            benchmark=f"train input peak RSS, shard above the budget ({BUDGET_MB} MB) vs below",
            candidate=f"{LARGE:,} examples, streamed",
            baseline=f"{SMALL:,} examples, in memory",
            candidate_value=streamed["rss"] / MB,
            baseline_value=small["rss"] / MB,
            unit="MB",
            target_ratio=TARGET,
            higher_is_better=False,
            notes=(
                f"one epoch of one worker, batch {BATCH}; streamed {streamed['plan']} "
                f"({LARGE / streamed['seconds']:,.0f} examples/s), in memory "
                f"{SMALL / small['seconds']:,.0f} examples/s; the large shard held in memory "
                f"(budget 1 GB) peaks at {held['rss'] / MB:,.0f} MB "
                f"({LARGE / held['seconds']:,.0f} examples/s)"
            ),
        )
    ]
