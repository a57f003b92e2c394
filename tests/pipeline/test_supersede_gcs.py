"""`--force-stage` on gs:// never overwrites a latest pointer another host moved meanwhile.

Two hosts share no lock, only the bucket (tests.gcs_emulator). The superseding host runs in
its own process with its own local state folder; just before one of its pointer writes it is
held until the other host (this test's process) has moved the pointer. Its write, carrying the
generation it read, is then refused, and it decides again on the pointer as it now is: it
leaves another date's blessing alone, and follows its own date's model when the other host
rewrote the pointer to it. Without the precondition it wrote its stale decision over them.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from typing import Any

import pytest

from contract import layout, pointer, storage
from pipeline import supersede
from tests.evaluate.test_pointer_gcs import gcs, root  # noqa: F401 - the emulator's fixtures
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


def _superseding_host(output_root: str, state_dir: str, markers: str, held_write: int) -> None:
    """Writes DATE's and LATER's runs with the pointer on DATE, then forces DATE's train
    stage; its `held_write`-th pointer write waits until the other host moved the pointer."""
    import tensorflow as tf

    from contract import atomic

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


def _race(output_root: str, tmp_path, held_write: int, other: dict[str, Any]) -> dict[str, Any]:
    """Runs the superseding host; moves the pointer to `other` while its write is held."""
    markers = tmp_path / "markers"
    markers.mkdir()
    host = multiprocessing.get_context("spawn").Process(
        target=_superseding_host,
        args=(output_root, str(tmp_path / "host"), str(markers), held_write),
    )
    host.start()
    try:
        wait_until(
            lambda: (markers / "read").exists(),
            timeout=180,
            failure=lambda: "the superseding host never came to its pointer write",
            alive=host.is_alive,
        )
        pointer.update(output_root, lambda current: other)  # the other host, with its own lock
        (markers / "moved").touch()
        host.join(timeout=180)
    finally:
        if host.is_alive():
            host.kill()
    assert host.exitcode == 0
    result: dict[str, Any] = json.loads((markers / "result.json").read_text())
    assert result["train_left"] is False  # the stage moved all the same
    return result


@pytest.mark.parametrize("held_write", [1, 2], ids=["before-the-keep", "after-the-move"])
def test_another_dates_blessing_is_not_overwritten(root, tmp_path, held_write):  # noqa: F811
    result = _race(root, tmp_path, held_write, blessed(LATER))
    assert result["pointer"] == blessed(LATER)
    assert result["model"] == LATER


def test_a_rewritten_pointer_to_the_moved_model_is_followed(root, tmp_path):  # noqa: F811
    rewritten = blessed(DATE, updated_utc="by the other host")
    result = _race(root, tmp_path, 1, rewritten)
    assert result["pointer"]["updated_utc"] == "by the other host"  # its write, not the stale one
    assert "/superseded/" in result["pointer"]["model_path"]
    assert supersede.KEEP_DIR not in result["pointer"]["model_path"]
    assert result["model"] == DATE
    assert result["writes"] == 3  # refused once, then to the keep folder and to the new place
