"""The data gate: a night's statistics checked against the kept schema and the last night's.

    python -m preprocess.data_gate --output_root runs --date 2026-01-02 [--accept_anomalies]

Reads the statistics the preprocess stage wrote (`<run>/data/statistics.pb`): `train` (the
train and validation splits) and `eval`. Both parts are checked against the schema kept as
`<output_root>/data_gate/schema.pbtxt` (tensorflow-metadata Schema, text format: every feature
present in every example, the image's number of values, labels and pixels inside their
domains, no unknown feature), and each is compared with the same part of the latest earlier
date whose gate passed: the label distribution by L-infinity distance, and the pixel mean and
standard deviation by their shift in units of that night's standard deviation. A window of
daily drops with fewer days that have files than `--min_window_days` (default: all of them) is
an anomaly too.

Without a kept schema (the first night), or with `--reset_schema` after a deliberate change of
the data, the schema is inferred from the night's training data and kept only once the night's
checks pass (with `--reset_schema`, also when its anomalies are accepted): a bad night never
becomes the schema.

Everything found goes to `<run>/data/anomalies.json` (written every time, empty when nothing
is found). An anomaly fails the stage with one line (exit 2), so Train never starts, unless
`--accept_anomalies` accepts it; `<run>/data/data_gate.json`, the verdict, is written last and
only when the data passed or was accepted.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
from typing import Any

from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2, statistics_pb2

from contract import atomic, dates, gfile, layout, lineage, manifest, run_lock, settings, storage
from contract.messages import EXIT_BAD_INPUT, EXIT_FAILED, StageArgumentParser, error_line
from preprocess import gate_checks, statistics
from preprocess.errors import BadInputError, PreprocessError
from preprocess.gate_checks import PARTS, TRAIN_PART
from preprocess.gate_config import DataGateConfig

RESET_HINT = (
    "if the data changed on purpose, rerun with --DataGate-reset-schema (python -m "
    "preprocess.data_gate: --reset_schema) to infer the schema again from tonight's data"
)
log = logging.getLogger(__name__)


def part_statistics(
    stats: statistics_pb2.DatasetFeatureStatisticsList, part: str, path: str
) -> statistics_pb2.DatasetFeatureStatistics:
    """The statistics of one part of the data (`train`, `eval`) in a list.

    Raises:
        PreprocessError: the list has none.
    """
    for dataset in stats.datasets:
        if dataset.name == part:
            return dataset
    raise PreprocessError(f"{path} holds no statistics of the '{part}' data")


def train_statistics(
    stats: statistics_pb2.DatasetFeatureStatisticsList, path: str
) -> statistics_pb2.DatasetFeatureStatistics:
    """The statistics of the training data in a list (see `part_statistics`)."""
    return part_statistics(stats, TRAIN_PART, path)


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
            "or rerun with --DataGate-reset-schema (python -m preprocess.data_gate: "
            "--reset_schema) to infer it again from tonight's data"
        ) from None


def previous_night(output_root: str, date: str) -> str | None:
    """The latest date before `date` whose data passed the gate (or was accepted)."""
    if not gfile.isdir(output_root):
        return None
    # Folders that are calendar dates, compared as dates (not as text).
    nights = sorted(
        (
            name.rstrip("/")
            for name in gfile.listdir(output_root)
            if dates.is_run_date(name.rstrip("/"))
        ),
        key=dates.parse,
        reverse=True,
    )
    for candidate in nights:
        if dates.parse(candidate) >= dates.parse(date):
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


def compare_with(
    output_root: str,
    baseline: str,
    current: dict[str, statistics_pb2.DatasetFeatureStatistics],
    thresholds: dict[str, float],
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Each part's drift from the same part of the baseline night: (measures, anomalies).

    Raises:
        PreprocessError: the baseline's statistics cannot be read.
    """
    before = read_statistics(layout.data_dir(output_root, baseline))
    measures: dict[str, float] = {}
    found: list[dict[str, Any]] = []
    for part in PARTS:
        previous = next((d for d in before.datasets if d.name == part), None)
        if previous is None:
            continue  # nothing of this part to compare with
        part_measures, drifted = gate_checks.drift(
            current[part], previous, baseline, thresholds, part
        )
        measures.update(part_measures)
        found += drifted
    return measures, found


def run_gate(config: DataGateConfig) -> dict[str, Any]:
    """Checks the night's data; writes anomalies.json, then (if it passes) the schema when it
    was inferred tonight, and data_gate.json.

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
    stats = read_statistics(data_dir)
    current = {part: part_statistics(stats, part, data_dir) for part in PARTS}
    kept = schema_path(output_root)
    inferred = config.reset_schema or not gfile.exists(kept)
    schema = gate_checks.infer_schema(current[TRAIN_PART]) if inferred else read_schema(kept)
    found = [a for part in PARTS for a in gate_checks.check_schema(schema, current[part], part)]
    window = None
    drops = manifest.read_manifest(data_dir).get(manifest.DROPS_KEY)
    if drops is not None:
        window = gate_checks.window_days(drops, config.min_window_days)
        found += gate_checks.check_window(window, date)
    baseline = previous_night(output_root, date)
    measures: dict[str, float] = {}
    if baseline is not None:
        measures, drifted = compare_with(output_root, baseline, current, config.thresholds)
        found += drifted
    anomalies_path = layout.join(data_dir, manifest.ANOMALIES_FILE)
    report = {
        "date": date,
        "anomalies": found,
        "accepted": bool(found) and config.accept_anomalies,
        "baseline_date": baseline,
        "measures": measures,
        "thresholds": config.thresholds,
        "reset_schema": config.reset_schema,
        **({"window": window} if window is not None else {}),
    }
    atomic.write_json_atomic(anomalies_path, report)
    if found and not config.accept_anomalies:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        # A kept schema the data no longer fits may be the one to change.
        schema_changed = not inferred and any(a["check"] == "schema" for a in found)
        raise BadInputError(
            f"data gate: {found[0]['description']}{more}; the run stops before training. "
            f"See {anomalies_path}; to train on this data anyway, rerun with "
            "--DataGate-accept-anomalies (python -m preprocess.data_gate: --accept_anomalies)"
            + (f"; {RESET_HINT}" if schema_changed else "")
        )
    text = text_format.MessageToString(schema).encode()
    # Only a night that passed (or, asked to reset, was accepted) becomes the schema.
    keep = inferred and (not found or config.reset_schema)
    if keep:
        gfile.makedirs(layout.join(output_root, manifest.SCHEMA_DIR))
        atomic.write_bytes_atomic(kept, text)
        log.info("inferred the schema %s from the data of %s", kept, date)
        reason = "reset_schema" if config.reset_schema else "first night"
        lineage.record(output_root, manifest.read_manifest(data_dir), date, reason)
    verdict = {
        "date": date,
        "status": "accepted" if found else "passed",
        "anomalies": len(found),
        "schema": {
            "path": kept,
            "inferred_now": inferred,
            "kept_now": keep,
            "sha256": hashlib.sha256(text).hexdigest() if inferred else atomic.sha256_file(kept),
        },
        "reset_schema": config.reset_schema,
        "baseline_date": baseline,
        "measures": measures,
        "thresholds": config.thresholds,
        **({"window": window} if window is not None else {}),
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
