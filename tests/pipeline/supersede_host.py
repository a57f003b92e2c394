"""`python -m tests.pipeline.supersede_host OUTPUT_ROOT STATE_DIR MARKERS HELD_WRITE`: the
superseding host of tests/pipeline/test_supersede_gcs.py, a process of its own with its own
local state folder. It writes DATE's and LATER's runs with the pointer on DATE, then forces
DATE's train stage; its HELD_WRITE-th pointer write waits (a `read` marker in MARKERS) until
the other host moved the pointer (a `moved` marker). What it decided goes to MARKERS/result.json.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import tensorflow as tf

from contract import atomic, layout, pointer, storage
from pipeline import supersede
from tests.waiting import wait_until

DATE, LATER = "2026-01-31", "2026-02-01"


def blessed(date: str, **extra: Any) -> dict[str, Any]:
    """A pointer naming `date`'s model and metrics (paths relative to the root)."""
    return {
        "date": date,
        "model_path": f"{date}/train/{layout.MODEL_FILE}",
        "metrics_path": f"{date}/evaluate/{layout.METRICS_FILE}",
        "accuracy": 0.9,
        "updated_utc": "first",
        **extra,
    }


def superseding_host(output_root: str, state_dir: str, markers: str, held_write: int) -> None:
    """Writes DATE's and LATER's runs with the pointer on DATE, then forces DATE's train
    stage; its `held_write`-th pointer write waits until the other host moved the pointer."""
    os.environ[storage.STATE_DIR_ENV] = state_dir
    for date in (DATE, LATER):
        atomic.write_bytes_atomic(f"{output_root}/{date}/train/{layout.MODEL_FILE}", date.encode())
        atomic.write_json_atomic(f"{output_root}/{date}/train/{layout.HISTORY_FILE}", {})
        atomic.write_json_atomic(f"{output_root}/{date}/evaluate/{layout.METRICS_FILE}", {})
    pointer.write(output_root, blessed(DATE), if_generation=0)

    write = pointer.write
    writes: list[dict[str, Any]] = []

    def held(at: str, new: dict[str, Any], if_generation: int | None = None) -> None:
        writes.append(new)
        if len(writes) == held_write:
            open(os.path.join(markers, "read"), "w").close()
            wait_until(
                lambda: os.path.exists(os.path.join(markers, "moved")),
                timeout=120,
                failure=lambda: "the other host never moved the pointer",
            )
        write(at, new, if_generation=if_generation)

    pointer.write = held  # type: ignore[assignment]
    supersede.supersede(output_root, DATE, "train")
    final = pointer.read(output_root)
    assert final is not None
    result = {
        "pointer": final,
        "model": tf.io.gfile.GFile(pointer.resolve(output_root, final["model_path"]), "rb")
        .read()
        .decode(),
        "writes": len(writes),
        "train_left": tf.io.gfile.exists(layout.train_dir(output_root, DATE)),
    }
    with open(os.path.join(markers, "result.json"), "w") as f:
        json.dump(result, f)


def main() -> None:
    output_root, state_dir, markers, held_write = sys.argv[1:]
    superseding_host(output_root, state_dir, markers, int(held_write))


if __name__ == "__main__":
    main()
