"""`python -m pipeline status`: a row a night from the ledger, missing nights, the exit status."""

from __future__ import annotations

import datetime
import json

import pytest

from contract import ledger
from pipeline import __main__ as pipeline_main
from pipeline import status

TODAY = datetime.datetime.now(datetime.UTC).date()


def day(back: int) -> str:
    """The date `back` days before today (UTC)."""
    return (TODAY - datetime.timedelta(days=back)).isoformat()


def attempt(root, date: str, outcome: str, hour: int = 1, **fields) -> None:
    """One ledger record of `date`, started at `hour`:30 UTC of that day."""
    ledger.append(
        str(root),
        {
            "date": date,
            "entry_point": "FullRun",
            "started_utc": f"{date}T{hour:02d}:30:00+00:00",
            "ended_utc": f"{date}T{hour:02d}:45:00+00:00",
            "outcome": outcome,
            "wall_seconds": 900.0,
            **fields,
        },
    )


def evaluation(root, date: str, accuracy: float, comparison=None, version=None) -> None:
    """The evaluate stage's files of `date`: metrics, blessing, and a push when `version`."""
    folder = root / date / "evaluate"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"accuracy": accuracy}))
    blessing = {"blessed": version is not None, "comparison": comparison}
    (folder / "blessing.json").write_text(json.dumps(blessing))
    push = {"pushed": version is not None, "version": version}
    (folder / "push.json").write_text(json.dumps(push))


def rows_of(text: str) -> dict[str, str]:
    """The table's rows by date."""
    return {line.split()[0]: line for line in text.splitlines()[1:]}


def test_missing_nights_show_and_a_missing_last_night_exits_1(tmp_path, capsys):
    attempt(tmp_path, day(3), ledger.BLESSED)
    evaluation(tmp_path, day(3), 0.9123)
    attempt(tmp_path, day(1), ledger.FAILED, stage="Train", reason="unknown model 'nope'")

    assert status.main(["--output-root", str(tmp_path), "--nights", "5"]) == 1
    rows = rows_of(capsys.readouterr().out)
    # Nights before the ledger's first are left out; today always has its row.
    assert list(rows) == [day(3), day(2), day(1), day(0)]
    assert rows[day(3)].split()[1:3] == ["blessed", "0.9123"]
    assert rows[day(2)].split()[1] == rows[day(0)].split()[1] == "missing"
    assert rows[day(1)].split()[1] == "failed"
    assert rows[day(1)].endswith("Train: unknown model 'nope'")
    assert "15m00s" in rows[day(3)]


def test_a_blessed_last_night_exits_0_with_its_interval_and_served_version(tmp_path, capsys):
    attempt(tmp_path, day(0), ledger.FAILED, hour=1, stage="DataGate", reason="label drift")
    attempt(tmp_path, day(0), ledger.BLESSED, hour=2)
    attempt(tmp_path, day(0), ledger.SKIPPED_COMPLETE, hour=3)  # a rerun that found it done
    comparison = {"lower": -0.0041, "upper": 0.0062, "difference": 0.001}
    evaluation(tmp_path, day(0), 0.9123, comparison, version=20260131)

    assert status.main(["--output-root", str(tmp_path)]) == 0
    (row,) = rows_of(capsys.readouterr().out).values()
    assert row.split()[1] == "blessed"
    assert "0.9123 [-0.004, +0.006]" in row and "20260131" in row
    assert row.split()[-1] == "3"  # attempts that night


@pytest.mark.parametrize(
    ("outcome", "code"),
    [
        (ledger.NOT_BLESSED, 0),
        (ledger.REFUSED, 1),
        (ledger.FAILED, 1),
        (ledger.SUCCEEDED, 1),  # a stage run alone: the night was not evaluated
    ],
)
def test_the_exit_status_follows_the_last_nights_outcome(tmp_path, capsys, outcome, code):
    attempt(tmp_path, day(0), outcome)
    assert status.main(["--output-root", str(tmp_path)]) == code


def test_the_table_ends_at_the_newest_ledger_date_when_it_is_after_today(tmp_path, capsys):
    attempt(tmp_path, day(-2), ledger.BLESSED)  # a machine whose clock runs ahead of UTC
    assert status.main(["--output-root", str(tmp_path), "--nights", "2", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [n["date"] for n in document["nights"]] == [day(-2)]  # no night before the first
    assert document["nights"][0]["outcome"] == ledger.BLESSED and document["exit_status"] == 0


def test_today_names_the_morning_the_table_ends_at(tmp_path, capsys):
    attempt(tmp_path, day(9), ledger.BLESSED)
    args = ["--output-root", str(tmp_path), "--nights", "2", "--json"]
    # The day after a missed night, as a monitor saw it then.
    assert status.main([*args, "--today", day(8)]) == 1
    document = json.loads(capsys.readouterr().out)
    assert [(n["date"], n["outcome"]) for n in document["nights"]] == [
        (day(9), ledger.BLESSED),
        (day(8), status.MISSING),
    ]
    # A day before the newest ledger date ends the table at that date, as today does.
    attempt(tmp_path, day(7), ledger.BLESSED)
    assert status.main([*args, "--today", day(8)]) == 0
    assert json.loads(capsys.readouterr().out)["nights"][-1]["date"] == day(7)
    with pytest.raises(SystemExit) as refused:
        status.main([*args, "--today", "2026-2-1"])
    assert refused.value.code == 2
    assert "--today must be a calendar date YYYY-MM-DD" in capsys.readouterr().err


def test_a_folder_that_is_not_an_output_root_is_one_error_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a run")
    for folder in (tmp_path, tmp_path / "absent"):
        assert status.main(["--output-root", str(folder)]) == 2
        out, err = capsys.readouterr()
        (line,) = err.strip().splitlines()
        assert out == "" and line.startswith("error: ") and "is not an output root" in line
        assert "--output-root" in line


def test_an_output_root_without_a_ledger_shows_its_last_night_missing(tmp_path, capsys):
    (tmp_path / day(5) / "data").mkdir(parents=True)  # runs made before the ledger existed
    assert status.main(["--output-root", str(tmp_path)]) == 1
    assert [line.split()[:2] for line in capsys.readouterr().out.splitlines()[1:]] == [
        [day(0), "missing"]
    ]


def test_python_m_pipeline_status_is_a_subcommand_and_luigi_gets_the_rest(tmp_path, capsys):
    attempt(tmp_path, day(0), ledger.BLESSED)
    assert pipeline_main.main(["status", f"--output-root={tmp_path}"]) == 0
    assert day(0) in capsys.readouterr().out
    assert pipeline_main.luigi_argv(["--local-scheduler"]) == [
        "--module",
        "pipeline",
        "FullRun",
        "--local-scheduler",
    ]
    assert pipeline_main.luigi_argv(["Train", "--date=2026-01-31"])[2] == "Train"
