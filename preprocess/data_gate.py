"""The data gate: a night's statistics checked against the kept schema and the last night's.

    python -m preprocess.data_gate --output_root runs --date 2026-01-02 [--accept_anomalies]

Reads the `train` statistics the preprocess stage wrote (`<run>/data/statistics.pb`). On the
first night there is no schema: one is inferred from them (tensorflow-metadata Schema, text
format) and kept as `<output_root>/data_gate/schema.pbtxt`; later nights are checked against it
(every feature present in every example, the image's number of values, labels and pixels inside
their domains, no unknown feature). The night is also compared with the statistics of the
latest earlier date whose gate passed: the label distribution by L-infinity distance, and the
pixel mean and standard deviation by their shift in units of that night's standard deviation.

Everything found goes to `<run>/data/anomalies.json` (written every time, empty when nothing
is found). An anomaly fails the stage with one line (exit 2), so Train never starts, unless
`--accept_anomalies` accepts it; `<run>/data/data_gate.json`, the verdict, is written last and
only when the data passed or was accepted. To take a deliberate change of the data as the new
normal, remove the schema file: the next night infers it again.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from typing import Any

import numpy as np
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2, statistics_pb2

from contract import atomic, gfile, layout, manifest, run_lock, settings, storage
from contract.messages import EXIT_BAD_INPUT, EXIT_FAILED, StageArgumentParser, error_line
from preprocess import statistics
from preprocess.errors import BadInputError, PreprocessError
from preprocess.gate_config import DataGateConfig

TRAIN_PART = "train"
PIXEL_MAX = 255
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
log = logging.getLogger(__name__)


def anomaly(check: str, feature: str, message: str, **values: Any) -> dict[str, Any]:
    """One anomaly as written to anomalies.json."""
    return {"check": check, "feature": feature, "description": message, **values}


def train_statistics(
    stats: statistics_pb2.DatasetFeatureStatisticsList, path: str
) -> statistics_pb2.DatasetFeatureStatistics:
    """The statistics of the training data in a list.

    Raises:
        PreprocessError: the list has none.
    """
    for dataset in stats.datasets:
        if dataset.name == TRAIN_PART:
            return dataset
    raise PreprocessError(f"{path} holds no statistics of the '{TRAIN_PART}' data")


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
    schema: schema_pb2.Schema, dataset: statistics_pb2.DatasetFeatureStatistics
) -> list[dict[str, Any]]:
    """What in the night's statistics the schema does not allow."""
    found = []
    if dataset.num_examples == 0:
        found.append(anomaly("schema", "", "the training data holds no examples"))
    known = {f.name for f in schema.feature}
    for stats in dataset.features:
        name = ".".join(stats.path.step) or stats.name
        if name not in known:
            found.append(anomaly("schema", name, f"feature '{name}' is not in the schema"))
    for feature in schema.feature:
        stats = statistics.feature(dataset, feature.name)
        if stats is None:
            found.append(anomaly("schema", feature.name, f"feature '{feature.name}' is missing"))
            continue
        common = stats.num_stats.common_stats
        present = common.num_non_missing / max(1, dataset.num_examples)
        if present < feature.presence.min_fraction:
            found.append(anomaly(
                "schema", feature.name,
                f"feature '{feature.name}' is in {present:.1%} of the examples, the schema "
                f"asks for {feature.presence.min_fraction:.0%}",
            ))  # fmt: skip
        if feature.HasField("value_count") and (
            common.min_num_values < feature.value_count.min
            or common.max_num_values > feature.value_count.max
        ):
            found.append(anomaly(
                "schema", feature.name,
                f"feature '{feature.name}' has {common.min_num_values}-{common.max_num_values} "
                f"values an example, the schema {feature.value_count.min}-"
                f"{feature.value_count.max} (another image shape?)",
            ))  # fmt: skip
        domain = feature.int_domain
        if feature.HasField("int_domain") and (
            stats.num_stats.min < domain.min or stats.num_stats.max > domain.max
        ):
            found.append(anomaly(
                "schema", feature.name,
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
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """The night's distances from the previous night's data, and those over their threshold
    (`thresholds` by their names in THRESHOLD_NAMES)."""
    now, before = statistics.label_distribution(current), statistics.label_distribution(previous)
    width = max(len(now), len(before))
    now, before = np.pad(now, (0, width - len(now))), np.pad(before, (0, width - len(before)))
    gaps = np.abs(now - before)
    label_linf = float(gaps.max()) if width else 0.0
    image, image_before = (
        statistics.feature(d, statistics.IMAGE_FEATURE) for d in (current, previous)
    )
    measures = {"label_linf": label_linf}
    found = []
    label_limit = thresholds["label_drift"]
    if label_linf > label_limit:
        worst = int(gaps.argmax())
        found.append(anomaly(
            "label_drift", statistics.LABEL_FEATURE,
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
            measures[name] = shift
            if shift > limit:
                what = "mean" if name == "pixel_mean_shift" else "standard deviation"
                found.append(anomaly(
                    name, statistics.IMAGE_FEATURE,
                    f"the pixel {what} moved from {before_value:.3f} to {now_value:.3f} since "
                    f"{previous_date}, {shift:.4f} standard deviations, over the threshold "
                    f"{limit:g}",
                    value=shift, threshold=limit, baseline_date=previous_date,
                ))  # fmt: skip
    return measures, found


def schema_path(output_root: str) -> str:
    """Where the kept schema lives: `<output_root>/data_gate/schema.pbtxt`."""
    return layout.join(output_root, manifest.SCHEMA_DIR, manifest.SCHEMA_FILE)


def read_schema(path: str) -> schema_pb2.Schema:
    """Reads a text-format schema.

    Raises:
        BadInputError: the file is not a Schema in text format.
    """
    with gfile.GFile(path, "r") as f:
        text = f.read()
    try:
        return text_format.Parse(text, schema_pb2.Schema())
    except text_format.ParseError as e:
        raise BadInputError(
            f"schema {path} is not a tensorflow-metadata Schema in text format ({e}): fix it, "
            "or remove it to infer it again from the next night"
        ) from None


def previous_night(output_root: str, date: str) -> str | None:
    """The latest date before `date` whose data passed the gate (or was accepted)."""
    if not gfile.isdir(output_root):
        return None
    dates = sorted(
        (name.rstrip("/") for name in gfile.listdir(output_root)),
        reverse=True,
    )
    for candidate in dates:
        if not _DATE.fullmatch(candidate) or candidate >= date:
            continue
        data_dir = layout.data_dir(output_root, candidate)
        if gfile.exists(layout.join(data_dir, manifest.DATA_GATE_FILE)):
            return candidate
    return None


def read_statistics(data_dir: str) -> statistics_pb2.DatasetFeatureStatisticsList:
    """The statistics a shard set's manifest names, checked against its sha256; a shard set
    without them (made by an older version, or by hand) is counted from its files here.

    Raises:
        PreprocessError: the statistics file differs from its manifest entry.
    """
    doc = manifest.read_manifest(data_dir)
    entry = doc.get(manifest.STATISTICS_KEY)
    if entry is None:
        log.info("%s names no statistics file: counting its shard files", data_dir)
        counted = [
            statistics.file_counts(f, data_dir, doc["image_shape"], doc["num_classes"])
            for f in doc["files"]
        ]
        return statistics.from_counts(counted, doc["image_shape"])
    path = layout.join(data_dir, entry["path"])
    if not gfile.exists(path) or atomic.sha256_file(path) != entry["sha256"]:
        raise PreprocessError(f"statistics file {path} is missing or differs from its manifest")
    return statistics.read(path)


def run_gate(config: DataGateConfig) -> dict[str, Any]:
    """Checks the night's data; writes anomalies.json, then (if it passes) data_gate.json.

    Returns:
        The verdict written to `<run>/data/data_gate.json`.

    Raises:
        BadInputError: an anomaly was found and not accepted (one line naming the first one,
            the number found and the anomalies file), or a setting is out of range.
        PreprocessError: the night's statistics or the previous night's cannot be read.
    """
    config.check()
    output_root, date = config.output_root, config.date
    data_dir = layout.data_dir(output_root, date)
    current = train_statistics(read_statistics(data_dir), data_dir)
    kept = schema_path(output_root)
    inferred = not gfile.exists(kept)
    if inferred:
        schema = infer_schema(current)
        gfile.makedirs(layout.join(output_root, manifest.SCHEMA_DIR))
        atomic.write_bytes_atomic(kept, text_format.MessageToString(schema).encode())
        log.info("inferred the schema %s from the data of %s", kept, date)
    else:
        schema = read_schema(kept)
    found = check_schema(schema, current)
    baseline = previous_night(output_root, date)
    measures: dict[str, float] = {}
    if baseline is not None:
        previous_dir = layout.data_dir(output_root, baseline)
        previous = train_statistics(read_statistics(previous_dir), previous_dir)
        measures, drifted = drift(current, previous, baseline, config.thresholds)
        found += drifted
    anomalies_path = layout.join(data_dir, manifest.ANOMALIES_FILE)
    report = {
        "date": date,
        "anomalies": found,
        "accepted": bool(found) and config.accept_anomalies,
        "baseline_date": baseline,
        "measures": measures,
        "thresholds": config.thresholds,
    }
    atomic.write_json_atomic(anomalies_path, report)
    if found and not config.accept_anomalies:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise BadInputError(
            f"data gate: {found[0]['description']}{more}; the run stops before training. "
            f"See {anomalies_path}; to train on this data anyway, rerun with "
            "--DataGate-accept-anomalies (python -m preprocess.data_gate: --accept_anomalies)"
        )
    verdict = {
        "date": date,
        "status": "accepted" if found else "passed",
        "anomalies": len(found),
        "schema": {
            "path": kept,
            "inferred_now": inferred,
            "sha256": atomic.sha256_file(kept),
        },
        "baseline_date": baseline,
        "measures": measures,
        "thresholds": config.thresholds,
    }
    atomic.write_json_atomic(layout.join(data_dir, manifest.DATA_GATE_FILE), verdict)
    return verdict


def parse_args(argv: list[str] | None = None) -> DataGateConfig:
    """The gate's config of its command line (unchecked: `DataGateConfig.check`)."""
    parser = StageArgumentParser(
        prog="python -m preprocess.data_gate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    settings.add_flags(parser, DataGateConfig, underscores=True)
    return settings.from_flags(DataGateConfig, parser.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    """Command line: runs the gate and prints its verdict, or its one-line error."""
    config = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        storage.check_supported(config.output_root)
        config.check()
        run_lock.hold_for_process(layout.run_dir(config.output_root, config.date))
        verdict = run_gate(config)
    except (BadInputError, storage.UnsupportedStorageError) as e:
        print(error_line(str(e)), file=sys.stderr)
        return EXIT_BAD_INPUT
    except (PreprocessError, manifest.ManifestError, run_lock.RunLockedError) as e:
        print(error_line(str(e)), file=sys.stderr)
        return EXIT_FAILED
    baseline = verdict["baseline_date"] or "none (first night)"
    print(f"data gate {verdict['status']}: {verdict['anomalies']} anomalies, previous night "
          f"{baseline}, schema {verdict['schema']['path']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
