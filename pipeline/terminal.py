"""Stage start/end lines, epoch lines and a stage's notices, on the luigi process's stderr."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def format_duration(seconds: float) -> str:
    """`4m47s`, `1h02m03s` or `12s` for a duration in seconds."""
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def format_size(count: float) -> str:
    """`12.3 MiB`, or `843 B`, for a number of bytes."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


class StageProgress:
    """Prints a stage's start, end or failure, and an epoch line per `PROGRESS` line."""

    def __init__(self, stage: str, stream: TextIO | None = None) -> None:
        self.stage = stage
        self.stream = stream
        self.started = time.monotonic()
        self.last_epoch_at = self.started
        self.epoch_seconds: list[float] = []

    def _print(self, text: str) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        print(f"[{self.stage}] {text}", file=stream, flush=True)

    def start(self) -> None:
        """Prints `[stage] started HH:MM:SS`."""
        self.started = self.last_epoch_at = time.monotonic()
        self._print(f"started {time.strftime('%H:%M:%S')}")

    def done(self) -> None:
        """Prints `[stage] done in <duration>`."""
        self._print(f"done in {format_duration(time.monotonic() - self.started)}")

    def failed(self, error: str) -> None:
        """Prints `[stage] FAILED after <duration>: <error>`."""
        self._print(f"FAILED after {format_duration(time.monotonic() - self.started)}: {error}")

    def notice(self, text: str) -> None:
        """Prints `[stage] <text>`; the next epoch's time (for the ETA) starts from here."""
        self.last_epoch_at = time.monotonic()
        self._print(text)

    def epoch(self, progress: dict[str, Any], now: float | None = None) -> None:
        """Prints one epoch line for a progress dict with `epoch` and `epochs`."""
        now = time.monotonic() if now is None else now
        self.epoch_seconds.append(now - self.last_epoch_at)
        self.last_epoch_at = now
        self._print(epoch_line(progress, self.epoch_seconds))


def epoch_line(progress: dict[str, Any], epoch_seconds: list[float]) -> str:
    """`epoch 3/10 loss 0.4123 ... lr 1.0e-03 1234 ex/s ETA 2m10s` from a progress dict.

    ETA is the mean seen epoch time times the epochs left; fields absent are left out.
    """
    epoch, epochs = int(progress["epoch"]), int(progress["epochs"])
    parts = [f"epoch {epoch}/{epochs}"]
    for key, label in (
        ("loss", "loss"),
        ("accuracy", "acc"),
        ("val_loss", "val_loss"),
        ("val_accuracy", "val_acc"),
    ):
        if isinstance(progress.get(key), (int, float)):
            parts.append(f"{label} {progress[key]:.4f}")
    if isinstance(progress.get("learning_rate"), (int, float)):
        parts.append(f"lr {progress['learning_rate']:.2e}")
    if isinstance(progress.get("examples_per_second"), (int, float)):
        parts.append(f"{progress['examples_per_second']:.0f} ex/s")
    if epoch_seconds:
        mean = sum(epoch_seconds) / len(epoch_seconds)
        parts.append(f"ETA {format_duration(mean * max(0, epochs - epoch))}")
    return " ".join(parts)


def evaluation_line(evaluate_dir: str) -> str:
    """`accuracy 0.9312, blessed (reasons...)` from an evaluate directory (local or gs://),
    read defensively."""
    from contract import atomic, gfile, layout

    def read(name: str) -> dict[str, Any]:
        try:
            data = atomic.read_json(layout.join(evaluate_dir, name))
        except Exception as e:  # a store's errors are TensorFlow's, known once it has loaded
            if isinstance(e, (ValueError, *gfile.file_errors())):
                return {}
            raise
        return data if isinstance(data, dict) else {}

    metrics, blessing = read("metrics.json"), read("blessing.json")
    parts = []
    if isinstance(metrics.get("accuracy"), (int, float)):
        parts.append(f"accuracy {metrics['accuracy']:.4f}")
    blessed = blessing.get("blessed", metrics.get("blessed"))
    if isinstance(blessed, bool):
        parts.append("blessed" if blessed else "NOT blessed")
    reasons = blessing.get("reasons")
    if isinstance(reasons, list) and reasons:
        parts.append("(" + "; ".join(str(r) for r in reasons) + ")")
    return " ".join(parts) or f"no metrics.json/blessing.json in {evaluate_dir}"
