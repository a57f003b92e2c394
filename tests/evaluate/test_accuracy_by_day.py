"""A night of daily drops: the report gives the accuracy on each drop day of the eval split."""

from __future__ import annotations

import collections
import json
import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from contract import layout, manifest, records
from evaluate import EvaluateConfig, report, report_page, run
from preprocess import run_preprocess
from tests.evaluate import trained_run
from tests.preprocess.test_drops import config, dataset, drop_folder  # noqa: F401 - a fixture

DATE = "2026-01-03"


@pytest.fixture(scope="module")
def drops_night(drop_folder, tmp_path_factory) -> EvaluateConfig:  # noqa: F811
    """A three-day window of drops with its eval split held out of them, a tiny model trained
    on it, and its evaluation run."""
    tmp = tmp_path_factory.mktemp("drops-night")
    cfg = config(
        tmp, dataset(drop_folder, test=False), date=DATE, window_days=3, eval_fraction=0.3,
        num_workers=1,
    )  # fmt: skip
    doc = run_preprocess(cfg, ["--direct_num_workers=1"])
    trained_run.train_on_shard_set(cfg.output_root, DATE, doc, epochs=3)
    evaluation = EvaluateConfig(
        output_root=cfg.output_root,
        date=DATE,
        dataset=cfg.dataset,
        batch_size=32,
        bless_without_thresholds=True,
    )
    run(evaluation)
    return evaluation


def _by_day_of_each_record(evaluation: EvaluateConfig) -> dict[str, list[bool]]:
    """Day -> whether the model gets each of its eval examples right, read file by file."""
    doc = manifest.read_manifest(evaluation.data_dir)
    spec = records.feature_spec() | records.day_spec()
    images, labels, days = [], [], []
    for path in manifest.split_paths(evaluation.data_dir, doc, layout.EVAL_SPLIT):
        for serialized in tf.data.TFRecordDataset(path).as_numpy_iterator():
            parsed = tf.io.parse_single_example(serialized, spec)
            images.append(tf.io.decode_raw(parsed[records.IMAGE_KEY], tf.uint8).numpy())
            labels.append(int(parsed[records.LABEL_KEY]))
            days.append(parsed[records.DAY_KEY].numpy().decode())
    pixels = np.stack(images).reshape([-1, *doc["image_shape"]]).astype(np.float32)
    model = tf_keras.models.load_model(evaluation.model_path)
    predicted = model.predict(pixels, verbose=0).argmax(axis=1)
    right = collections.defaultdict(list)
    for day, label, guess in zip(days, labels, predicted, strict=True):
        right[day].append(bool(label == guess))
    return right


def test_accuracy_by_drop_day_is_in_metrics_and_in_the_report(drops_night):
    out = pathlib.Path(drops_night.evaluate_dir)
    metrics = json.loads((out / layout.METRICS_FILE).read_text())
    by_day = metrics["accuracy_by_day"]
    # Every day of the window, oldest first, and together the whole eval split.
    assert [row["day"] for row in by_day] == ["2026-01-01", "2026-01-02", "2026-01-03"]
    assert sum(row["num_examples"] for row in by_day) == metrics["num_examples"]
    # Each day's accuracy is that of its own examples, found record by record.
    right = _by_day_of_each_record(drops_night)
    assert {row["day"]: row["num_examples"] for row in by_day} == {
        day: len(found) for day, found in right.items()
    }
    for row in by_day:
        assert row["accuracy"] == pytest.approx(float(np.mean(right[row["day"]])), abs=1e-12)
    accuracies = [row["accuracy"] for row in by_day]
    weighted = sum(row["accuracy"] * row["num_examples"] for row in by_day)
    assert weighted / metrics["num_examples"] == pytest.approx(metrics["accuracy"])
    assert min(accuracies) > 0.0 and max(accuracies) < 1.0  # not trivially equal

    page = (out / report_page.REPORT_HTML_FILE).read_text()
    table = page.split('<table id="by-day">')[1].split("</table>")[0]
    cells = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table)]
    assert [c for c in cells if c] == [
        [row["day"], str(row["num_examples"]), f"{row['accuracy']:.4f}"] for row in by_day
    ]
    markdown = (out / report.REPORT_FILE).read_text()
    assert "## Accuracy by drop day" in markdown
    assert f"| 2026-01-02 | {by_day[1]['num_examples']} | {by_day[1]['accuracy']:.4f} |" in markdown
