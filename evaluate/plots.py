"""The stage's pictures: confusion matrix, training curves and the nightly trend, by matplotlib."""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: nightly runs have no display

import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from contract import atomic, dates  # noqa: E402

# (blessed?, label, marker, colour) of the trend plot's points.
_TREND_MARKS = ((True, "blessed", "o", "#1a7f37"), (False, "not blessed", "X", "#cf222e"))


def _save_png(figure: Figure, path: str) -> bytes:
    """Writes the figure as a PNG, atomically, and returns the PNG's bytes."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    png = buffer.getvalue()
    atomic.write_bytes_atomic(path, png)
    return png


def write_confusion_matrix(matrix: list[list[int]], class_names: list[str], path: str) -> bytes:
    """Draws the confusion matrix (counts, true classes down, predictions across); returns
    the PNG written."""
    counts = np.asarray(matrix)
    figure, axes = plt.subplots(figsize=(9, 8))
    image = axes.imshow(counts, interpolation="nearest", cmap="Blues")
    figure.colorbar(image, ax=axes)
    # Each count in the colour that reads on its cell: white on the darker half of the scale.
    threshold = (counts.max() + counts.min()) / 2
    for (row, column), count in np.ndenumerate(counts):
        colour = "white" if count > threshold else "black"
        axes.text(column, row, f"{count:d}", ha="center", va="center", color=colour)
    ticks = range(len(class_names))
    axes.set_xticks(ticks, class_names, rotation=45, ha="right", rotation_mode="anchor")
    axes.set_yticks(ticks, class_names)
    axes.set_xlabel("Predicted label")
    axes.set_ylabel("True label")
    axes.set_title("Confusion matrix on the eval split")
    return _save_png(figure, path)


def write_training_curves(history: dict[str, Any], path: str) -> bytes:
    """Draws loss, accuracy and (when recorded) the learning rate per epoch.

    Args:
        history: the train stage's history.json `history` object (metric name -> per-epoch).
        path: where the PNG goes.

    Returns:
        The PNG written.
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
    return _save_png(figure, path)


def write_reliability_diagram(calibration: dict[str, Any], path: str) -> bytes:
    """Draws accuracy against mean confidence per confidence bin (evaluate.predictions).

    Args:
        calibration: `predictions.calibration`'s document (bins, count, accuracy, confidence,
            ece).
        path: where the PNG goes.

    Returns:
        The PNG written.
    """
    bins = int(calibration["bins"])
    width = 1.0 / bins
    lefts = np.arange(bins) * width
    accuracy = [a if a is not None else 0.0 for a in calibration["accuracy"]]
    figure, (top, bottom) = plt.subplots(
        2, 1, figsize=(6, 7), height_ratios=[3, 1], sharex=True, layout="constrained"
    )
    top.bar(lefts, accuracy, width=width, align="edge", edgecolor="black", label="accuracy")
    top.plot([0, 1], [0, 1], linestyle="--", color="0.5", label="perfect calibration")
    filled = [(c, a) for c, a in zip(calibration["confidence"], accuracy, strict=True) if c]
    if filled:
        top.scatter(*zip(*filled, strict=True), color="#cf222e", zorder=3, label="mean confidence")
    top.set_ylabel("accuracy in bin")
    top.set_ylim(0, 1)
    top.set_title(f"Reliability diagram (expected calibration error {calibration['ece']:.4f})")
    top.legend(loc="upper left")
    bottom.bar(lefts, calibration["count"], width=width, align="edge", color="0.6")
    bottom.set_xlabel("top-class probability")
    bottom.set_ylabel("examples")
    bottom.set_xlim(0, 1)
    return _save_png(figure, path)


def write_trend(
    run_dates: list[str],
    accuracies: list[float],
    blessed: list[bool],
    path: str,
    intervals: list[tuple[float, float] | None] | None = None,
) -> None:
    """Draws eval accuracy over nights, blessed nights marked apart from the others.

    Args:
        run_dates: the nights, `YYYY-MM-DD`, oldest first.
        accuracies: each night's eval accuracy.
        blessed: whether each night was blessed.
        path: where the PNG goes.
        intervals: per night, the paired interval of its accuracy change against the model it
            was compared with (None where there was none); drawn as a bar around the point at
            the baseline's accuracy plus the interval's ends.
    """
    # Real dates on the axis, so a missing night shows as a gap rather than a neighbour.
    days = mdates.date2num([dates.parse(d) for d in run_dates])
    figure, axes = plt.subplots(figsize=(9, 4), layout="constrained")
    axes.plot(days, accuracies, color="0.6", zorder=1)
    bars = [(i, band) for i, band in enumerate(intervals or []) if band is not None]
    if bars:
        axes.vlines(
            [days[i] for i, _ in bars],
            [band[0] for _, band in bars],
            [band[1] for _, band in bars],
            color="#0969da",
            linewidth=3,
            alpha=0.5,
            label="interval of the change against the baseline",
            zorder=1.5,
        )
    for wanted, label, marker, colour in _TREND_MARKS:
        picked = [i for i, b in enumerate(blessed) if b is wanted]
        if picked:
            axes.scatter(
                days[picked],
                np.asarray(accuracies)[picked],
                s=70,
                marker=marker,
                color=colour,
                label=label,
                zorder=2,
            )
    if not run_dates:
        axes.text(0.5, 0.5, "no evaluated nights yet", ha="center", transform=axes.transAxes)
    axes.set_title("Eval accuracy per night")
    axes.set_ylabel("accuracy")
    axes.grid(True, alpha=0.3)
    if len(run_dates) <= 12:
        axes.set_xticks(days, labels=run_dates)  # a tick per night, none between
    else:
        axes.xaxis.set_major_locator(mdates.AutoDateLocator(maxticks=12))
        axes.xaxis.set_major_formatter(mdates.DateFormatter("%Y-%m-%d"))
    axes.tick_params(axis="x", labelrotation=30)
    if axes.get_legend_handles_labels()[0]:
        axes.legend()
    _save_png(figure, path)
