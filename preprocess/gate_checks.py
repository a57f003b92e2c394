"""The data gate's checks: a part of the data against the schema and the previous night, and
the days of a window of daily drops.

Each check returns anomalies (dicts written to anomalies.json). A part is `train` (the train
and validation splits) or `eval`; an eval anomaly's description begins with "eval split:" and
its measures' names with "eval_", so both parts are told apart in the files and the messages.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tensorflow_metadata.proto.v0 import schema_pb2, statistics_pb2

from preprocess import statistics

TRAIN_PART, EVAL_PART = "train", "eval"
PARTS = (TRAIN_PART, EVAL_PART)
PIXEL_MAX = 255
_WHAT = {TRAIN_PART: "the training data", EVAL_PART: "the eval data"}


def anomaly(check: str, feature: str, message: str, **values: Any) -> dict[str, Any]:
    """One anomaly as written to anomalies.json."""
    return {"check": check, "feature": feature, "description": message, **values}


def _of(part: str, check: str, feature: str, message: str, **values: Any) -> dict[str, Any]:
    """An anomaly of one part of the data."""
    prefix = "eval split: " if part == EVAL_PART else ""
    return anomaly(check, feature, prefix + message, part=part, **values)


def infer_schema(dataset: statistics_pb2.DatasetFeatureStatistics) -> schema_pb2.Schema:
    """A schema the night's data fits: each feature required in every example, with the
    number of values and the value range it has (labels: the class indices seen)."""
    schema = schema_pb2.Schema()
    for stats in dataset.features:
        name = ".".join(stats.path.step) or stats.name
        feature = schema.feature.add(name=name, type=schema_pb2.INT)
        feature.presence.min_fraction = 1.0
        feature.presence.min_count = 1
        common = stats.num_stats.common_stats
        feature.value_count.min = common.min_num_values
        feature.value_count.max = common.max_num_values
        if name == statistics.IMAGE_FEATURE:
            feature.int_domain.min, feature.int_domain.max = 0, PIXEL_MAX
        else:
            # Every class index of the dataset, seen tonight or not: a bucket per class.
            classes = (
                len(stats.num_stats.histograms[0].buckets) if stats.num_stats.histograms else 0
            )
            feature.int_domain.min = 0
            feature.int_domain.max = max(classes - 1, int(stats.num_stats.max))
            feature.int_domain.is_categorical = True
    return schema


def check_schema(
    schema: schema_pb2.Schema,
    dataset: statistics_pb2.DatasetFeatureStatistics,
    part: str = TRAIN_PART,
) -> list[dict[str, Any]]:
    """What in one part's statistics the schema does not allow."""
    found = []
    if dataset.num_examples == 0:
        found.append(_of(part, "schema", "", f"{_WHAT[part]} holds no examples"))
    known = {f.name for f in schema.feature}
    for stats in dataset.features:
        name = ".".join(stats.path.step) or stats.name
        if name not in known:
            found.append(_of(part, "schema", name, f"feature '{name}' is not in the schema"))
    for feature in schema.feature:
        stats = statistics.feature(dataset, feature.name)
        if stats is None:
            found.append(_of(part, "schema", feature.name, f"feature '{feature.name}' is missing"))
            continue
        common = stats.num_stats.common_stats
        present = common.num_non_missing / max(1, dataset.num_examples)
        if present < feature.presence.min_fraction:
            found.append(_of(
                part, "schema", feature.name,
                f"feature '{feature.name}' is in {present:.1%} of the examples, the schema "
                f"asks for {feature.presence.min_fraction:.0%}",
            ))  # fmt: skip
        if feature.HasField("value_count") and (
            common.min_num_values < feature.value_count.min
            or common.max_num_values > feature.value_count.max
        ):
            found.append(_of(
                part, "schema", feature.name,
                f"feature '{feature.name}' has {common.min_num_values}-{common.max_num_values} "
                f"values an example, the schema {feature.value_count.min}-"
                f"{feature.value_count.max} (another image shape?)",
            ))  # fmt: skip
        domain = feature.int_domain
        if feature.HasField("int_domain") and (
            stats.num_stats.min < domain.min or stats.num_stats.max > domain.max
        ):
            found.append(_of(
                part, "schema", feature.name,
                f"feature '{feature.name}' has values {stats.num_stats.min:g} to "
                f"{stats.num_stats.max:g}, the schema's domain is {domain.min} to {domain.max}"
                + (" (a new class?)" if domain.is_categorical else ""),
            ))  # fmt: skip
    return found


def drift(
    current: statistics_pb2.DatasetFeatureStatistics,
    previous: statistics_pb2.DatasetFeatureStatistics,
    previous_date: str,
    thresholds: dict[str, float],
    part: str = TRAIN_PART,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """One part's distances from the previous night's same part, and those over their
    threshold (`thresholds` by their names in THRESHOLD_NAMES)."""
    now, before = statistics.label_distribution(current), statistics.label_distribution(previous)
    width = max(len(now), len(before))
    now, before = np.pad(now, (0, width - len(now))), np.pad(before, (0, width - len(before)))
    gaps = np.abs(now - before)
    label_linf = float(gaps.max()) if width else 0.0
    image, image_before = (
        statistics.feature(d, statistics.IMAGE_FEATURE) for d in (current, previous)
    )
    named = "" if part == TRAIN_PART else f"{part}_"
    measures = {f"{named}label_linf": label_linf}
    found = []
    label_limit = thresholds["label_drift"]
    if label_linf > label_limit:
        worst = int(gaps.argmax())
        found.append(_of(
            part, "label_drift", statistics.LABEL_FEATURE,
            f"the label distribution moved by L-infinity {label_linf:.4f} since {previous_date} "
            f"(class {worst}: {before[worst]:.4f} -> {now[worst]:.4f}), over the threshold "
            f"{label_limit:g}",
            value=label_linf, threshold=label_limit, baseline_date=previous_date,
        ))  # fmt: skip
    if image is not None and image_before is not None:
        scale = image_before.num_stats.std_dev or 1.0
        for name, now_value, before_value, limit in (
            ("pixel_mean_shift", image.num_stats.mean, image_before.num_stats.mean,
             thresholds["pixel_mean_shift"]),
            ("pixel_stddev_shift", image.num_stats.std_dev, image_before.num_stats.std_dev,
             thresholds["pixel_stddev_shift"]),
        ):  # fmt: skip
            shift = abs(now_value - before_value) / scale
            measures[f"{named}{name}"] = shift
            if shift > limit:
                what = "mean" if name == "pixel_mean_shift" else "standard deviation"
                found.append(_of(
                    part, name, statistics.IMAGE_FEATURE,
                    f"the pixel {what} moved from {before_value:.3f} to {now_value:.3f} since "
                    f"{previous_date}, {shift:.4f} standard deviations, over the threshold "
                    f"{limit:g}",
                    value=shift, threshold=limit, baseline_date=previous_date,
                ))  # fmt: skip
    return measures, found


def window_days(drops: dict[str, Any], min_window_days: int | None) -> dict[str, Any]:
    """How many of a drops window's days had files, and how many must have: the manifest's
    `drops` section's `days` and `days_read`, and `min_window_days` (None: every day)."""
    days = list(drops.get("days", []))
    present = [day for day in drops.get("days_read", []) if day in days]
    return {
        "days": len(days),
        "days_present": len(present),
        "min_window_days": len(days) if min_window_days is None else min_window_days,
        "missing_days": [day for day in days if day not in present],
    }


def check_window(counted: dict[str, Any], last_day: str) -> list[dict[str, Any]]:
    """An anomaly when fewer days of the window had files than required (`window_days`)."""
    if counted["days_present"] >= counted["min_window_days"]:
        return []
    missing = counted["missing_days"]
    return [anomaly(
        "window_days", "",
        f"the {counted['days']}-day window ending {last_day} has files for "
        f"{counted['days_present']} of its days"
        + (f" (none for {', '.join(missing)})" if missing else "")
        + f", fewer than min_window_days {counted['min_window_days']}",
        value=counted["days_present"], threshold=counted["min_window_days"],
    )]  # fmt: skip
