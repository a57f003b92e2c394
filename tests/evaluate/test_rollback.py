"""`python -m pipeline rollback`: back to an earlier blessed night, served and recorded."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess

import pytest
import tf_keras

from contract import atomic, history, layout, ledger, lineage, pointer
from contract.messages import ERROR_PREFIX, EXIT_BAD_INPUT
from evaluate import EvaluateConfig, run, served
from pipeline.__main__ import main
from tests.evaluate.conftest import DATE, placeholder_pictures
from tests.factories import PROJECT_ROOT
from tests.tensorflow_probe import NOT_LOADED_LINE, probe_argv

NIGHTS = ("2026-01-29", "2026-01-30", "2026-01-31")
VERSIONS = [2026012900, 2026013000, 2026013100]


def _evaluate(root, date: str) -> dict:
    """Evaluates `date`; the report's pictures are placeholders (checked in test_stage.py)."""
    config = EvaluateConfig(
        output_root=str(root), date=date, batch_size=128, min_accuracy=0.0, max_regression=0.5
    )
    with placeholder_pictures():
        return run(config)


@pytest.fixture(scope="module")
def three_nights_template(trained_template, tmp_path_factory):
    """Three nights, each with its own model, all blessed and served in turn."""
    template, _ = trained_template
    root = tmp_path_factory.mktemp("three-nights") / "runs"
    model = tf_keras.models.load_model(str(template / DATE / "train" / layout.MODEL_FILE))
    for number, date in enumerate(NIGHTS):
        shutil.copytree(template / DATE, root / date)
        kernel, bias = model.layers[-1].get_weights()
        model.layers[-1].set_weights([kernel + 1e-4 * number, bias])  # another model, as good
        model.save(str(root / date / "train" / layout.MODEL_FILE))
        assert _evaluate(root, date)["blessed"]
    assert pointer.read(str(root))["date"] == NIGHTS[-1]
    assert served.served_versions(str(root / "serving"), "nightly") == VERSIONS
    return root


@pytest.fixture
def three_nights(three_nights_template, tmp_path):
    """A private copy of the three nights (paths in them are relative to the root)."""
    root = tmp_path / "runs"
    shutil.copytree(three_nights_template, root)
    return root


def _rollback(root, *args: str) -> int:
    return main(["rollback", "--output-root", str(root), *args])


def _problems(root) -> list[str]:
    return served.problems(str(root), str(root / "serving"), "nightly")


def test_rollback_serves_the_night_again_and_records_who_when_and_why(three_nights, capsys):
    root = three_nights
    assert _rollback(root, "--to", NIGHTS[0], "--reason", "bad labels on the 30th") == 0
    out = capsys.readouterr().out
    assert (
        f"latest.json: {NIGHTS[2]} (version 2026013100) -> {NIGHTS[0]} (version 2026012900)" in out
    )
    assert "quarantine: served version 2026013100" in out
    current = pointer.read(str(root))
    model = root / NIGHTS[0] / "train" / layout.MODEL_FILE
    assert current["date"] == NIGHTS[0] and current["version"] == 2026012900
    assert current["model_sha256"] == atomic.sha256_file(str(model))
    assert served.served_versions(str(root / "serving"), "nightly") == [2026012900]
    quarantined = sorted(os.listdir(served.quarantine_dir(str(root / "serving"), "nightly")))
    assert [name.split("-")[0] for name in quarantined] == ["2026013000", "2026013100"]
    assert _problems(root) == []
    (record_file,) = os.listdir(root / "rollbacks")
    record = json.loads((root / "rollbacks" / record_file).read_text())
    assert (record["from"], record["to"], record["reason"]) == (
        NIGHTS[2],
        NIGHTS[0],
        "bad labels on the 30th",
    )
    assert "@" in record["who"] and record["when_utc"]
    assert record["rolled_back_nights"] == list(NIGHTS[1:])
    for night in NIGHTS[1:]:
        assert (root / night / "evaluate" / history.ROLLED_BACK_FILE).exists()
    (entry,) = [r for r in ledger.read(str(root)) if r["entry_point"] == "rollback"]
    assert entry["outcome"] == ledger.SUCCEEDED and entry["rollback"]["to"] == NIGHTS[0]

    # The next night is judged against the model rolled back to.
    shutil.copytree(
        root / NIGHTS[0], root / "2026-02-01", ignore=shutil.ignore_patterns("evaluate")
    )
    _evaluate(root, "2026-02-01")
    verdict = atomic.read_json(str(root / "2026-02-01" / "evaluate" / layout.BLESSING_FILE))
    assert verdict["baseline"]["date"] == NIGHTS[0]
    assert verdict["comparison"]["candidate_only"] == verdict["comparison"]["baseline_only"] == 0
    assert pointer.read(str(root))["date"] == "2026-02-01" and _problems(root) == []


def test_a_dry_run_prints_the_moves_and_moves_nothing(three_nights, capsys):
    root = three_nights
    before = (root / layout.LATEST_POINTER_FILE).read_text()
    assert _rollback(root, "--to", NIGHTS[1], "--dry-run") == 0
    out = capsys.readouterr().out.splitlines()
    moved = f"{NIGHTS[2]} (version 2026013100) -> {NIGHTS[1]} (version 2026013000)"
    assert out == [
        f"would move: latest.json: {moved}",
        "would move: quarantine: served version 2026013100",
        f"would move: mark rolled back: {NIGHTS[2]}",
    ]
    assert (root / layout.LATEST_POINTER_FILE).read_text() == before
    assert served.served_versions(str(root / "serving"), "nightly") == VERSIONS
    assert not (root / "rollbacks").exists()


def test_rolling_forward_again_brings_the_version_back_from_quarantine(three_nights):
    root = three_nights
    assert _rollback(root, "--to", NIGHTS[0]) == 0
    assert _rollback(root, "--to", NIGHTS[2]) == 0
    assert pointer.read(str(root))["date"] == NIGHTS[2]
    assert served.served_versions(str(root / "serving"), "nightly") == [2026012900, 2026013100]
    assert not (root / NIGHTS[2] / "evaluate" / history.ROLLED_BACK_FILE).exists()
    assert (root / NIGHTS[1] / "evaluate" / history.ROLLED_BACK_FILE).exists()
    assert _problems(root) == []


def test_the_command_on_a_local_root_rolls_back_without_loading_tensorflow(three_nights):
    # An operator's command: it reads and moves files, so it starts in a fraction of a second
    # rather than after TensorFlow's import.
    argv = ["rollback", "--output-root", str(three_nights), "--to", NIGHTS[1]]
    done = subprocess.run(
        probe_argv("pipeline", *argv), cwd=PROJECT_ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == NOT_LOADED_LINE
    assert pointer.read(str(three_nights))["date"] == NIGHTS[1]
    assert served.served_versions(str(three_nights / "serving"), "nightly") == VERSIONS[:2]


def _future(root) -> tuple[str, str]:
    tomorrow = datetime.datetime.now(datetime.UTC).date() + datetime.timedelta(days=1)
    return tomorrow.isoformat(), "is in the future"


def _never_blessed(root) -> tuple[str, str]:
    path = root / NIGHTS[1] / "evaluate" / layout.BLESSING_FILE
    verdict = atomic.read_json(str(path))
    atomic.write_json_atomic(str(path), verdict | {"blessed": False})
    return NIGHTS[1], f"{NIGHTS[1]} was not blessed"


def _never_ran(root) -> tuple[str, str]:
    return "2026-01-15", "2026-01-15 has no finished evaluation"


def _changed_model(root) -> tuple[str, str]:
    with open(root / NIGHTS[0] / "train" / layout.MODEL_FILE, "ab") as f:
        f.write(b"\0")
    return NIGHTS[0], "has changed since it was blessed"


def _missing_model(root) -> tuple[str, str]:
    os.remove(root / NIGHTS[0] / "train" / layout.MODEL_FILE)
    return NIGHTS[0], "is missing"


def _no_calendar_date(root) -> tuple[str, str]:
    return "2026-02-30", "--to"


def _another_lineage(root) -> tuple[str, str]:
    _reset_lineage(root)
    return NIGHTS[0], "its model is of another dataset than the output root's lineage since"


def _reset_lineage(root) -> dict:
    """Records a lineage of another dataset (the same images, other classes) since 2026-02-01."""
    doc = atomic.read_json(str(root / NIGHTS[0] / "data" / layout.MANIFEST_FILE))
    other = doc | {"class_names": [f"kind {i}" for i in range(len(doc["class_names"]))]}
    (root / "data_gate").mkdir(exist_ok=True)
    lineage.record(str(root), other, "2026-02-01", "reset_schema")
    return other


@pytest.mark.parametrize(
    "breaks",
    [
        _future,
        _never_blessed,
        _never_ran,
        _changed_model,
        _missing_model,
        _no_calendar_date,
        _another_lineage,
    ],
)
def test_a_rollback_that_cannot_be_done_is_one_line_and_changes_nothing(
    three_nights, capsys, breaks
):
    root = three_nights
    to_date, said = breaks(root)
    before = (root / layout.LATEST_POINTER_FILE).read_text()
    assert _rollback(root, "--to", to_date) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(ERROR_PREFIX) and said in err[0], err
    assert (root / layout.LATEST_POINTER_FILE).read_text() == before
    assert served.served_versions(str(root / "serving"), "nightly") == VERSIONS
    refused = [r for r in ledger.read(str(root)) if r["entry_point"] == "rollback"]
    assert [r["outcome"] for r in refused] == [ledger.REFUSED]


def test_a_folder_that_is_no_output_root_is_refused(tmp_path, capsys):
    assert _rollback(tmp_path, "--to", NIGHTS[0]) == EXIT_BAD_INPUT
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "is not an output root" in line
    assert list(tmp_path.iterdir()) == []


def test_a_rollback_alerts_through_notify_and_the_ledger_names_the_alert(three_nights, monkeypatch):
    from pipeline import notify

    sent = []

    def send(output_root, date, outcome, reason, links=None, settings=None):
        sent.append((output_root, date, outcome, reason))
        return [{"channel": "webhook", "date": date, "outcome": outcome, "status": "sent"}]

    monkeypatch.setattr(notify, "send", send)
    assert _rollback(three_nights, "--to", NIGHTS[1], "--reason", "a bad drop") == 0
    ((root, date, outcome, reason),) = sent
    assert (root, date, outcome) == (str(three_nights), NIGHTS[1], notify.ROLLBACK)
    assert f"rolled back from {NIGHTS[2]} to {NIGHTS[1]}" in reason and "a bad drop" in reason
    (entry,) = [r for r in ledger.read(str(three_nights)) if r["entry_point"] == "rollback"]
    assert entry["alerts"][0]["outcome"] == notify.ROLLBACK


def test_a_night_of_another_lineage_is_never_returned_to_but_an_older_record_is(three_nights):
    root = three_nights
    own = history.night_pointer(str(root), NIGHTS[1])[pointer.IDENTITY_KEY]
    other = lineage.identity(_reset_lineage(root))
    assert history.last_blessed_before(str(root), NIGHTS[2], own)["date"] == NIGHTS[1]
    assert history.last_blessed_before(str(root), NIGHTS[2], other) is None
    # A night evaluated before evaluations recorded the dataset's identity is taken.
    path = root / NIGHTS[1] / "evaluate" / layout.METRICS_FILE
    metrics = atomic.read_json(str(path))
    del metrics["dataset"]["identity"]
    atomic.write_json_atomic(str(path), metrics)
    assert history.last_blessed_before(str(root), NIGHTS[2], other)["date"] == NIGHTS[1]
    assert _rollback(root, "--to", NIGHTS[1]) == 0
    assert pointer.IDENTITY_KEY not in pointer.read(str(root)) and _problems(root) == []
