"""The data gate: schema inferred on the first night and kept, drift against the previous
night, the anomalies file, and the operator's override."""

from __future__ import annotations

import hashlib
import json
import pathlib
import subprocess

import numpy as np
import pytest
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2, statistics_pb2

from contract import atomic, layout, manifest
from contract.messages import EXIT_BAD_INPUT
from preprocess import data_gate, statistics
from preprocess.errors import BadInputError
from tests import factories
from tests.tensorflow_probe import NOT_LOADED_LINE, probe_argv

THRESHOLDS = {
    "label_drift_threshold": 0.1,
    "pixel_mean_shift_threshold": 0.1,
    "pixel_stddev_shift_threshold": 0.1,
}
BALANCED = [100] * 10


def pixel_histogram(mean: float, spread: float = 60.0) -> list[int]:
    """Counts of pixel values 0-255 around `mean`."""
    values = np.clip(np.round(np.random.default_rng(0).normal(mean, spread, 200_000)), 0, 255)
    return np.bincount(values.astype(np.int64), minlength=256).tolist()


def part_statistics(
    part: str, label_counts: list[int], mean: float, pixels_per_image: int
) -> statistics_pb2.DatasetFeatureStatisticsList:
    """Statistics of one part of the data: `label_counts` images of `pixels_per_image` pixels
    around `mean`."""
    histogram = np.asarray(pixel_histogram(mean))
    examples = sum(label_counts)
    # Scale the pixel counts to `examples` images of `pixels_per_image` pixels.
    histogram = np.round(histogram / histogram.sum() * examples * pixels_per_image).astype(int)
    histogram[0] += examples * pixels_per_image - histogram.sum()
    values = np.arange(256)
    counts = {
        "examples": examples,
        "pixel_sum": int((values * histogram).sum()),
        "pixel_square_sum": int((values * values * histogram).sum()),
        "pixel_histogram": histogram,
        "label_counts": np.asarray(label_counts),
    }
    return statistics.to_proto({part: counts}, [pixels_per_image // 28, 28, 1])


def write_night(
    root: pathlib.Path,
    date: str,
    label_counts: list[int] = BALANCED,
    mean: float = 80.0,
    pixels_per_image: int = 784,
    eval_labels: list[int] = BALANCED,
    eval_pixels: int = 784,
    drops: dict | None = None,
) -> str:
    """A data folder whose manifest names a statistics file of these counts: the training
    data's, and (unless changed) the same eval data every night."""
    stats = part_statistics("train", label_counts, mean, pixels_per_image)
    stats.datasets.extend(part_statistics("eval", eval_labels, 80.0, eval_pixels).datasets)
    data = stats.SerializeToString()
    shape = [pixels_per_image // 28, 28, 1]
    data_dir = layout.data_dir(str(root), date)
    pathlib.Path(data_dir).mkdir(parents=True)
    atomic.write_bytes_atomic(layout.join(data_dir, manifest.STATISTICS_FILE), data)

    doc = {
        "schema_version": manifest.SCHEMA_VERSION,
        "dataset": {"name": "test"},
        "num_workers": 1,
        "image_shape": shape,
        "num_classes": len(label_counts),
        "class_names": [str(i) for i in range(len(label_counts))],
        "splits": {},
        "files": [],
        "statistics": {
            "path": manifest.STATISTICS_FILE,
            "sha256": hashlib.sha256(data).hexdigest(),
            "size_bytes": len(data),
        },
        **({"drops": drops} if drops is not None else {}),
    }
    atomic.write_json_atomic(layout.join(data_dir, layout.MANIFEST_FILE), doc)
    return data_dir


def read(path: str) -> dict:
    return json.loads(pathlib.Path(path).read_text())


def gate(root: pathlib.Path, date: str, **changed) -> dict:
    """Runs the gate on `date` of `root` with THRESHOLDS and the `changed` settings."""
    return data_gate.run_gate(data_gate.DataGateConfig(str(root), date, **(THRESHOLDS | changed)))


def test_first_night_infers_the_schema_and_later_nights_keep_it(tmp_path):
    first = write_night(tmp_path, "2026-01-01")
    verdict = gate(tmp_path, "2026-01-01")
    kept = tmp_path / "data_gate" / "schema.pbtxt"
    schema = text_format.Parse(kept.read_text(), schema_pb2.Schema())
    features = {f.name: f for f in schema.feature}
    assert set(features) == {"image", "label"}
    assert features["image"].value_count.min == features["image"].value_count.max == 784
    assert (features["label"].int_domain.min, features["label"].int_domain.max) == (0, 9)
    assert verdict["status"] == "passed" and verdict["schema"]["inferred_now"] is True
    assert verdict["baseline_date"] is None
    assert read(layout.join(first, "anomalies.json"))["anomalies"] == []
    assert read(layout.join(first, "data_gate.json")) == verdict

    text = kept.read_text() + "\n# kept by hand\n"
    kept.write_text(text)
    write_night(tmp_path, "2026-01-02", [101] * 5 + [99] * 5, mean=80.5)
    verdict = gate(tmp_path, "2026-01-02")
    assert verdict["schema"]["inferred_now"] is False and kept.read_text() == text
    assert verdict["baseline_date"] == "2026-01-01" and verdict["status"] == "passed"
    assert verdict["measures"]["label_linf"] == pytest.approx(0.001)
    assert 0 < verdict["measures"]["pixel_mean_shift"] < 0.1


def test_drifted_labels_stop_the_night_and_the_override_lets_them_through(tmp_path):
    write_night(tmp_path, "2026-01-01")
    gate(tmp_path, "2026-01-01")
    night = write_night(tmp_path, "2026-01-02", [400] + [67] * 9)  # class 0: 10% -> 40%
    with pytest.raises(BadInputError) as refused:
        gate(tmp_path, "2026-01-02")
    message = str(refused.value)
    assert message.startswith("data gate: the label distribution moved by L-infinity 0.2")
    assert "since 2026-01-01" in message and "--DataGate-accept-anomalies" in message
    report = read(layout.join(night, "anomalies.json"))
    assert [a["check"] for a in report["anomalies"]] == ["label_drift"]
    assert report["anomalies"][0]["value"] == pytest.approx(400 / 1003 - 0.1)
    assert report["accepted"] is False
    assert not pathlib.Path(night, "data_gate.json").exists()

    verdict = gate(tmp_path, "2026-01-02", accept_anomalies=True)
    assert verdict["status"] == "accepted" and verdict["anomalies"] == 1
    assert read(layout.join(night, "anomalies.json"))["accepted"] is True


def test_a_night_is_compared_with_the_latest_earlier_passed_night(tmp_path):
    write_night(tmp_path, "2026-01-01")
    gate(tmp_path, "2026-01-01")
    write_night(tmp_path, "2026-01-02", [400] + [67] * 9)  # refused: never a baseline
    with pytest.raises(BadInputError):
        gate(tmp_path, "2026-01-02")
    write_night(tmp_path, "2026-01-05")  # a later night does not count for an earlier one
    gate(tmp_path, "2026-01-05")
    write_night(tmp_path, "2026-01-03")
    assert gate(tmp_path, "2026-01-03")["baseline_date"] == ("2026-01-01")


def test_pixel_shift_and_another_image_shape_are_anomalies(tmp_path):
    write_night(tmp_path, "2026-01-01")
    gate(tmp_path, "2026-01-01")
    night = write_night(tmp_path, "2026-01-02", mean=120.0, pixels_per_image=28 * 32)
    with pytest.raises(BadInputError, match=r"\(and 1 more\)"):
        gate(tmp_path, "2026-01-02")
    found = read(layout.join(night, "anomalies.json"))["anomalies"]
    assert [(a["check"], a["feature"]) for a in found] == [
        ("schema", "image"), ("pixel_mean_shift", "image"),
    ]  # fmt: skip
    assert "has 896-896 values an example, the schema 784-784" in found[0]["description"]


def test_a_shard_set_without_statistics_is_counted_from_its_files(tmp_path):
    data_dir = layout.data_dir(str(tmp_path), "2026-01-01")
    factories.write_shard_set(data_dir, per_worker=16, num_validation=8, num_eval=8)
    verdict = gate(tmp_path, "2026-01-01")
    assert verdict["status"] == "passed"
    stats = data_gate.read_statistics(data_dir)
    assert data_gate.train_statistics(stats, data_dir).num_examples == 40


def test_command_line_refuses_drift_in_one_line(tmp_path, capsys):
    write_night(tmp_path, "2026-01-01")
    gate(tmp_path, "2026-01-01")
    write_night(tmp_path, "2026-01-02", [400] + [67] * 9)
    argv = ["--output_root", str(tmp_path), "--date", "2026-01-02"]
    assert data_gate.main(argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: data gate: the label distribution")
    assert data_gate.main([*argv, "--label_drift_threshold", "0.5"]) == 0
    assert "data gate passed: 0 anomalies, previous night 2026-01-01" in capsys.readouterr().out


def test_the_thresholds_are_recorded_under_their_names(tmp_path):
    night = write_night(tmp_path, "2026-01-01")
    verdict = gate(tmp_path, "2026-01-01", label_drift_threshold=0.25)
    recorded = {"label_drift": 0.25, "pixel_mean_shift": 0.1, "pixel_stddev_shift": 0.1}
    assert verdict["thresholds"] == read(layout.join(night, "anomalies.json"))["thresholds"]
    assert verdict["thresholds"] == recorded


@pytest.mark.parametrize("value", ["-0.1", "nan", "inf"])
def test_command_line_refuses_a_threshold_out_of_range_in_one_line(tmp_path, capsys, value):
    night = write_night(tmp_path, "2026-01-01")
    argv = ["--output_root", str(tmp_path), "--date", "2026-01-01"]
    assert data_gate.main([*argv, "--pixel-mean-shift-threshold", value]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err == (
        "error: pixel_mean_shift_threshold must be a finite number of at least 0, "
        f"got {float(value)}\n"
    )
    assert not pathlib.Path(night, "anomalies.json").exists()
    assert not (tmp_path / "data_gate").exists()


def test_command_line_flags_are_the_configs(tmp_path):
    write_night(tmp_path, "2026-01-01")
    gate(tmp_path, "2026-01-01")
    night = write_night(tmp_path, "2026-01-02", [400] + [67] * 9)
    argv = ["--output-root", str(tmp_path), "--date", "2026-01-02", "--accept-anomalies"]
    assert data_gate.main(argv) == 0
    assert read(layout.join(night, "data_gate.json"))["status"] == "accepted"


def test_the_gate_of_a_local_night_runs_without_loading_tensorflow(tmp_path):
    # Its own process (`python -m preprocess.data_gate`, one per night) reads the statistics
    # the Beam job wrote and a schema: protobufs, with no TensorFlow to load.
    write_night(tmp_path, "2026-01-01")
    night = write_night(tmp_path, "2026-01-02")
    for date in ("2026-01-01", "2026-01-02"):
        argv = ["--output-root", str(tmp_path), "--date", date]
        proc = subprocess.run(
            probe_argv("preprocess.data_gate", *argv),
            cwd=factories.PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.splitlines()[-1] == NOT_LOADED_LINE
    assert read(layout.join(night, "data_gate.json"))["status"] == "passed"


def test_the_statistics_name_the_records_features():
    from contract import records

    assert (statistics.IMAGE_FEATURE, statistics.LABEL_FEATURE) == (
        records.IMAGE_KEY,
        records.LABEL_KEY,
    )


def test_the_eval_split_is_checked_against_the_schema(tmp_path):
    write_night(tmp_path, "2026-01-01")
    gate(tmp_path, "2026-01-01")
    night = write_night(tmp_path, "2026-01-02", eval_pixels=28 * 32)
    with pytest.raises(BadInputError) as refused:
        gate(tmp_path, "2026-01-02")
    assert str(refused.value).startswith(
        "data gate: eval split: feature 'image' has 896-896 values an example, the schema "
        "784-784 (another image shape?)"
    )
    found = read(layout.join(night, "anomalies.json"))["anomalies"]
    assert [(a["check"], a["feature"], a["part"]) for a in found] == [("schema", "image", "eval")]


def test_the_eval_split_is_compared_with_the_previous_nights(tmp_path):
    write_night(tmp_path, "2026-01-01")
    gate(tmp_path, "2026-01-01")
    night = write_night(tmp_path, "2026-01-02", eval_labels=[400] + [67] * 9)
    with pytest.raises(BadInputError, match="^data gate: eval split: the label distribution"):
        gate(tmp_path, "2026-01-02")
    found = read(layout.join(night, "anomalies.json"))["anomalies"]
    assert [(a["check"], a["part"]) for a in found] == [("label_drift", "eval")]
    verdict = gate(tmp_path, "2026-01-02", accept_anomalies=True)
    assert verdict["measures"]["eval_label_linf"] == pytest.approx(400 / 1003 - 0.1)
    assert verdict["measures"]["label_linf"] == 0


def window(days: list[str], read_days: list[str]) -> dict:
    """The manifest's drops section of a window of `days` of which `read_days` had files."""
    missing = [d for d in days if d not in read_days]
    return {"days": days, "days_read": read_days, "missing_days": missing, "window_days": len(days)}


def test_a_window_with_a_day_missing_fails_unless_fewer_days_are_asked_for(tmp_path):
    days = ["2026-01-01", "2026-01-02"]
    night = write_night(tmp_path, "2026-01-02", drops=window(days, days[1:]))
    with pytest.raises(BadInputError) as refused:
        gate(tmp_path, "2026-01-02")
    assert str(refused.value).startswith(
        "data gate: the 2-day window ending 2026-01-02 has files for 1 of its days (none for "
        "2026-01-01), fewer than min_window_days 2; the run stops before training."
    )
    report = read(layout.join(night, "anomalies.json"))
    assert report["window"] == {
        "days": 2, "days_present": 1, "min_window_days": 2, "missing_days": ["2026-01-01"],
    }  # fmt: skip
    assert [a["check"] for a in report["anomalies"]] == ["window_days"]
    assert not pathlib.Path(night, "data_gate.json").exists()
    verdict = gate(tmp_path, "2026-01-02", min_window_days=1)
    assert verdict["status"] == "passed" and verdict["window"]["min_window_days"] == 1
    full = write_night(tmp_path, "2026-01-03", drops=window(days[1:] + ["2026-01-03"], days[1:]
                                                             + ["2026-01-03"]))  # fmt: skip
    assert gate(tmp_path, "2026-01-03")["window"]["days_present"] == 2
    assert read(layout.join(full, "data_gate.json"))["status"] == "passed"


def test_a_short_window_is_let_through_by_the_override(tmp_path):
    days = ["2026-01-01", "2026-01-02", "2026-01-03"]
    write_night(tmp_path, "2026-01-03", drops=window(days, days[2:]))
    verdict = gate(tmp_path, "2026-01-03", min_window_days=2, accept_anomalies=True)
    assert verdict["status"] == "accepted" and verdict["anomalies"] == 1


def test_command_line_refuses_a_window_of_no_days(tmp_path, capsys):
    write_night(tmp_path, "2026-01-01")
    argv = ["--output_root", str(tmp_path), "--date", "2026-01-01", "--min_window_days", "0"]
    assert data_gate.main(argv) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == (
        "error: min_window_days must be at least 1 (a number of days), got 0\n"
    )


def test_a_bad_first_night_does_not_become_the_schema(tmp_path):
    kept = tmp_path / "data_gate" / "schema.pbtxt"
    days = ["2026-01-01", "2026-01-02"]
    write_night(tmp_path, "2026-01-02", pixels_per_image=28 * 32, drops=window(days, days[1:]))
    with pytest.raises(BadInputError, match=r"^data gate: eval split: .* \(and 1 more\)") as no:
        gate(tmp_path, "2026-01-02")
    assert "--DataGate-reset-schema" not in str(no.value)  # there is no schema to reset
    assert not kept.exists()
    # Accepted, the night trains, but is no schema either: only a night that passed is.
    verdict = gate(tmp_path, "2026-01-02", accept_anomalies=True)
    assert verdict["schema"]["inferred_now"] is True and verdict["schema"]["kept_now"] is False
    assert not kept.exists()
    write_night(tmp_path, "2026-01-03")
    verdict = gate(tmp_path, "2026-01-03", pixel_mean_shift_threshold=1.0)
    assert verdict["status"] == "passed" and verdict["schema"]["kept_now"] is True
    features = {f.name: f for f in data_gate.read_schema(str(kept)).feature}
    assert features["image"].value_count.max == 784


def test_reset_schema_infers_it_again_after_a_deliberate_change(tmp_path):
    kept = tmp_path / "data_gate" / "schema.pbtxt"
    write_night(tmp_path, "2026-01-01")
    gate(tmp_path, "2026-01-01")
    before = kept.read_text()
    night = write_night(tmp_path, "2026-01-02", pixels_per_image=28 * 32, eval_pixels=28 * 32)
    with pytest.raises(BadInputError) as refused:
        gate(tmp_path, "2026-01-02")
    assert str(refused.value).endswith(
        "; if the data changed on purpose, rerun with --DataGate-reset-schema (python -m "
        "preprocess.data_gate: --reset_schema) to infer the schema again from tonight's data"
    )
    assert kept.read_text() == before
    verdict = gate(tmp_path, "2026-01-02", reset_schema=True)
    assert verdict["status"] == "passed" and verdict["reset_schema"] is True
    assert verdict["schema"]["inferred_now"] is True and verdict["schema"]["kept_now"] is True
    assert read(layout.join(night, "data_gate.json")) == verdict
    assert read(layout.join(night, "anomalies.json"))["reset_schema"] is True
    features = {f.name: f for f in data_gate.read_schema(str(kept)).feature}
    assert features["image"].value_count.max == 896
    write_night(tmp_path, "2026-01-03", pixels_per_image=28 * 32, eval_pixels=28 * 32)
    later = gate(tmp_path, "2026-01-03")
    assert later["reset_schema"] is False and later["schema"]["inferred_now"] is False


def test_reset_schema_on_a_night_that_fails_keeps_the_old_schema(tmp_path):
    kept = tmp_path / "data_gate" / "schema.pbtxt"
    write_night(tmp_path, "2026-01-01")
    gate(tmp_path, "2026-01-01")
    before = kept.read_text()
    write_night(tmp_path, "2026-01-02", [400] + [67] * 9, pixels_per_image=28 * 32,
                eval_pixels=28 * 32)  # fmt: skip
    with pytest.raises(BadInputError, match="^data gate: the label distribution moved") as refused:
        gate(tmp_path, "2026-01-02", reset_schema=True)
    assert "--DataGate-reset-schema" not in str(refused.value)  # asked for already
    assert kept.read_text() == before
    # Accepting the night as well as resetting is taking it as the new normal.
    verdict = gate(tmp_path, "2026-01-02", reset_schema=True, accept_anomalies=True)
    assert verdict["status"] == "accepted" and verdict["schema"]["kept_now"] is True
    assert kept.read_text() != before


def test_an_unreadable_schema_names_the_reset(tmp_path):
    write_night(tmp_path, "2026-01-01")
    kept = tmp_path / "data_gate" / "schema.pbtxt"
    kept.parent.mkdir()
    kept.write_text("not a schema {")
    with pytest.raises(BadInputError, match="rerun with --DataGate-reset-schema"):
        gate(tmp_path, "2026-01-01")
    assert gate(tmp_path, "2026-01-01", reset_schema=True)["status"] == "passed"
    assert data_gate.read_schema(str(kept)).feature


def test_an_impossible_date_is_refused_and_night_folders_are_compared_as_dates(tmp_path):
    from preprocess import data_gate
    from preprocess.errors import BadInputError
    from preprocess.gate_config import DataGateConfig

    with pytest.raises(BadInputError, match="calendar date YYYY-MM-DD"):
        DataGateConfig(output_root=str(tmp_path), date="2026-02-30").check()
    # A folder that is no calendar date is no night, whatever it sorts like as text.
    for name in ("2026-01-30", "2026-02-30", "2026-01-31x"):
        (tmp_path / name / "data").mkdir(parents=True)
        (tmp_path / name / "data" / "data_gate.json").write_text("{}")
    assert data_gate.previous_night(str(tmp_path), "2026-03-01") == "2026-01-30"
