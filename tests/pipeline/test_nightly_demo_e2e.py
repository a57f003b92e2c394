"""The multi-night demo (`python -m tools.nightly_demo`, `make nightly-demo`): three nights on
growing daily drops, each warm-started from the last blessed model, blessed against it on the
same eval set, pushed when blessed and shown on the trend page; and its refusals."""

from __future__ import annotations

import html
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from contract import atomic, layout
from tests.factories import PROJECT_ROOT
from tools import nightly_demo

DATES = ("2026-03-01", "2026-03-02", "2026-03-03")
PER_DAY = 300
TEST_EXAMPLES = 200


def demo(root: pathlib.Path, *flags: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "tools.nightly_demo", f"--root={root}", f"--start={DATES[0]}",
        *flags,
    ]  # fmt: skip
    env = os.environ | {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(
        command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=900
    )


TINY = (
    f"--per-day={PER_DAY}", f"--test-examples={TEST_EXAMPLES}", "--model=mlp", "--epochs=1",
    "--num-workers=1", "--min-accuracy=0", "--",
    "--Preprocess-beam-args=--runner=DirectRunner --direct_num_workers=1",
    "--Train-per-worker-batch-size=32",
)  # fmt: skip


def read(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def score_on_eval_split(model_path: str, data_dir: str) -> float:
    """The accuracy of a stored model on a night's eval split, scored here independently."""
    import tf_keras

    from contract import manifest
    from evaluate import data, scoring

    doc = manifest.read_manifest(data_dir)
    model = tf_keras.models.load_model(model_path, compile=False)
    labels, probabilities = scoring.predict_split(model, data.eval_dataset(data_dir, doc, 100))
    return scoring.score(labels, probabilities, doc["class_names"])["accuracy"]


def row_cells(page: str, date: str) -> list[str]:
    row = page[page.index(f'<tr id="night-{date}">') :]
    row = row[: row.index("</tr>")]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
    return [html.unescape(re.sub(r"<[^>]+>", "", cell)) for cell in cells]


@pytest.mark.e2e
def test_three_nights_grow_warm_start_bless_against_the_last_blessed_and_push(tmp_path):
    root = tmp_path / "runs-demo"
    done = demo(root, *TINY)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    nights = {d: root / d for d in DATES}
    verdicts = {d: read(n / "evaluate" / "blessing.json") for d, n in nights.items()}
    assert all((n / "evaluate" / "metrics.json").is_file() for n in nights.values())
    assert verdicts[DATES[0]]["blessed"]  # min_accuracy 0 and nothing to compare with

    # Each night's window holds one more drop than the last: more examples to train on.
    shard_sets = {d: read(n / "data" / "manifest.json") for d, n in nights.items()}
    assert [len(shard_sets[d]["drops"]["days_read"]) for d in DATES] == [1, 2, 3]
    sizes = [shard_sets[d]["splits"]["train"]["num_examples"] for d in DATES]
    assert sizes[0] < sizes[1] < sizes[2]

    last_blessed = None
    page = (root / "index.html").read_text()
    headers = re.findall(r"<th>(.*?)</th>", page)
    for date in DATES:
        night, verdict = nights[date], verdicts[date]
        warm_start = read(night / "train" / "history.json")["warm_start"]
        metrics = read(night / "evaluate" / "metrics.json")
        assert metrics["num_examples"] == TEST_EXAMPLES  # the fixed eval set
        cells = dict(zip(headers, row_cells(page, date), strict=True))
        if last_blessed is None:
            assert warm_start["started_from"] is None and warm_start["cold_start_reason"]
            assert verdict["baseline"] is None
            assert cells["started from"] == "cold" and cells["baseline"] == "–"
        else:
            # Started from, and judged against, the model the latest pointer named.
            blessed_model = root / last_blessed / "train" / "model.keras"
            started = warm_start["started_from"]
            assert started["run_date"] == last_blessed
            assert pathlib.Path(started["model_path"]).resolve() == blessed_model.resolve()
            assert started["model_sha256"] == atomic.sha256_file(str(blessed_model))
            baseline = verdict["baseline"]
            assert baseline["date"] == last_blessed and baseline["scored"]
            assert baseline["accuracy"] == score_on_eval_split(
                str(blessed_model), layout.data_dir(str(root), date)
            )
            assert cells["started from"] == last_blessed
            assert cells["baseline"] == f"{baseline['accuracy']:.4f}"
        push = read(night / "evaluate" / "push.json")
        if verdict["blessed"]:
            version = date.replace("-", "") + "00"  # the date's first push
            assert push["pushed"] and push["version"] == int(version)
            assert (root / "serving" / "nightly" / version / "saved_model.pb").is_file()
            assert cells["pushed"] == version
            last_blessed = date
        else:
            assert not push.get("pushed") and cells["pushed"] == "–"
        assert cells["accuracy"] == f"{metrics['accuracy']:.4f}"
        assert cells["blessed"].startswith("yes" if verdict["blessed"] else "no")
        assert cells["days"] == f"{DATES.index(date) + 1} of 3"
        assert cells["train examples"] == f"{shard_sets[date]['splits']['train']['num_examples']:,}"

    # The summary table: a header and one line a night with its figures.
    table = done.stdout[done.stdout.index("date  ") :].splitlines()
    for date, line in zip(DATES, table[1:4], strict=True):
        metrics = read(nights[date] / "evaluate" / "metrics.json")
        assert line.startswith(date) and f"{metrics['accuracy']:.4f}" in line


def test_a_root_of_a_demo_with_other_settings_is_refused(tmp_path):
    root = tmp_path / "runs-demo"
    settings = nightly_demo.DemoSettings(root=str(root), model="mlp")
    assert nightly_demo.claim_root(settings)
    with pytest.raises(nightly_demo.DemoError, match=r"other settings: model 'mlp' \(now 'cnn'\)"):
        nightly_demo.claim_root(nightly_demo.DemoSettings(root=str(root), model="cnn"))
    assert nightly_demo.claim_root(settings)  # same settings, drops still to cut: carry on


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--days=2",), "error: --days must be at least 3 (a demo of several nights), got 2"),
        (("--start=March",), "error: --start must be YYYY-MM-DD, got 'March'"),
        (("--per-day=0",), "error: --per-day must be at least 1, got 0"),
    ],
)
def test_bad_settings_are_one_line_and_touch_nothing(tmp_path, flags, message, capsys):
    root = tmp_path / "runs-demo"
    assert nightly_demo.main([f"--root={root}", *flags]) == 2
    assert capsys.readouterr().err.strip() == message
    assert not root.exists()


def test_a_folder_that_is_not_a_demo_is_refused(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep")
    assert nightly_demo.main([f"--root={tmp_path}"]) == 2
    assert "is not a demo's (no demo.json): pass a new folder" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["mine.txt"]
