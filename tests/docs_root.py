"""A small output root as three blessed nights leave it, for running the docs' commands on.

Each night has a model file, its evaluation (metrics with the model's sha256, a blessed
verdict, a push), a served version whose marker names the same model, and the pointer names
the last night, and the run ledger has each night's record; nothing is trained, so it is made
in milliseconds.
"""

from __future__ import annotations

import json
from pathlib import Path

from contract import atomic, layout, ledger, pointer

NIGHTS = ("2026-01-29", "2026-01-30", "2026-01-31")


def _write(path: Path, content: bytes | dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(json.dumps(content).encode() if isinstance(content, dict) else content)


def write_three_nights(root: Path) -> None:
    """Writes `root` (an output root) with NIGHTS blessed and served in turn."""
    for number, date in enumerate(NIGHTS):
        night = root / date
        model = night / "train" / layout.MODEL_FILE
        _write(model, f"model of {date}".encode())
        sha = atomic.sha256_file(str(model))
        version = int(date.replace("-", "")) * 100
        _write(night / "data" / layout.MANIFEST_FILE, {"num_workers": 1})
        _write(night / "train" / layout.HISTORY_FILE, {"epochs_completed": 1})
        metrics = {
            "date": date,
            "accuracy": 0.9 + number / 100,
            "loss": 0.3,
            "model": {"path": f"{date}/train/{layout.MODEL_FILE}", "sha256": sha},
            "dataset": {"name": "fashion_mnist"},
        }
        _write(night / "evaluate" / layout.METRICS_FILE, metrics)
        _write(night / "evaluate" / layout.BLESSING_FILE, {"blessed": True, "reasons": []})
        _write(night / "evaluate" / layout.PUSH_FILE, {"pushed": True, "version": version})
        served = root / "serving" / "nightly" / str(version)
        _write(served / "saved_model.pb", b"graph")
        _write(served / "assets.extra" / "nightly_push.json", {"model_sha256": sha, "date": date})
        when = f"{date}T03:00:00+00:00"
        record = {"date": date, "entry_point": "FullRun", "outcome": ledger.BLESSED}
        ledger.append(str(root), record | {"started_utc": when, "ended_utc": when})
        pointer.write(
            str(root),
            {
                "date": date,
                "model_path": f"{date}/train/{layout.MODEL_FILE}",
                "model_sha256": sha,
                "accuracy": metrics["accuracy"],
                "loss": 0.3,
                "dataset": "fashion_mnist",
                "metrics_path": f"{date}/evaluate/{layout.METRICS_FILE}",
                "version": version,
            },
        )
