"""The stage's pictures: the confusion matrix and the training curves, drawn by matplotlib."""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: nightly runs have no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from sklearn.metrics import ConfusionMatrixDisplay  # noqa: E402

from contract import atomic  # noqa: E402


def _save_png(figure: Figure, path: str) -> None:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    atomic.write_bytes_atomic(path, buffer.getvalue())


def write_confusion_matrix(matrix: list[list[int]], class_names: list[str], path: str) -> None:
    """Draws the confusion matrix (counts, true classes down, predictions across)."""
    figure, axes = plt.subplots(figsize=(9, 8))
    display = ConfusionMatrixDisplay(np.asarray(matrix), display_labels=class_names)
    display.plot(ax=axes, cmap="Blues", xticks_rotation=45, colorbar=True, values_format="d")
    axes.set_title("Confusion matrix on the eval split")
    _save_png(figure, path)


def write_training_curves(history: dict[str, Any], path: str) -> None:
    """Draws loss, accuracy and (when recorded) the learning rate per epoch.

    Args:
        history: the train stage's history.json `history` object (metric name -> per-epoch).
        path: where the PNG goes.
    """
    panels = [("loss", "Loss"), ("accuracy", "Accuracy")]
    if history.get("learning_rate"):
        panels.append(("learning_rate", "Learning rate"))
    figure, axes = plt.subplots(
        1, len(panels), figsize=(5 * len(panels), 4), layout="constrained", squeeze=False
    )
    for ax, (key, title) in zip(axes[0], panels, strict=True):
        series = [(key, "train"), (f"val_{key}", "validation")]
        if key == "learning_rate":
            series = [(key, "learning rate")]
        for name, label in series:
            values = history.get(name)
            if values:
                epochs = range(1, len(values) + 1)
                ax.plot(epochs, values, marker="o", label=label)
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    figure.suptitle("Training curves (chief's history)")
    _save_png(figure, path)
