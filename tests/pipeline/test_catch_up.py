"""`python -m pipeline catch-up`: the nights that failed or were missed, rerun oldest first as
cron runs a night, stopping at the first that fails; and `status` names the command."""

from __future__ import annotations

import datetime
import json
import os
import socket

import pytest

from contract import ledger, run_lock
from pipeline import __main__ as pipeline_main
from pipeline import catch_up, status

TODAY = datetime.date(2026, 1, 31)


def day(back: int) -> str:
    return (TODAY - datetime.timedelta(days=back)).isoformat()


def attempt(root, date: str, outcome: str, hour: int = 1, **fields) -> None:
    when = f"{date}T{hour:02d}:30:00+00:00"
    record = {"date": date, "entry_point": "FullRun", "outcome": outcome}
    ledger.append(str(root), record | {"started_utc": when, "ended_utc": when, **fields})


def evaluated(root, date: str) -> None:
    """The night's evaluation files, as a blessed night leaves them."""
    folder = root / date / "evaluate"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"accuracy": 0.9}))
    (folder / "blessing.json").write_text(json.dumps({"blessed": True}))


@pytest.fixture
def nights(tmp_path):
    """Six nights: blessed, failed, missing, not blessed, refused, and one under way."""
    attempt(tmp_path, day(5), ledger.BLESSED)
    attempt(tmp_path, day(4), ledger.FAILED, stage="Train", reason="worker 1 died")
    attempt(tmp_path, day(2), ledger.NOT_BLESSED)
    attempt(tmp_path, day(1), ledger.REFUSED, stage="FullRun", reason="locked")
    ledger.begin(
        str(tmp_path),
        {
            "attempt_id": "under-way",
            "date": day(0),
            "entry_point": "FullRun",
            "started_utc": datetime.datetime.now(datetime.UTC).isoformat(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        },
    )
    return tmp_path


@pytest.fixture
def ran(monkeypatch):
    """Stands in for running a night: records the command, files a blessed record of its date,
    and exits with the code `codes` gives the date (0 by default)."""
    calls: list[list[str]] = []
    codes: dict[str, int] = {}

    def run_night(command: list[str]) -> int:
        calls.append(command)
        date = next(a.split("=", 1)[1] for a in command if a.startswith("--date="))
        root = next(a.split("=", 1)[1] for a in command if a.startswith("--output-root="))
        code = codes.get(date, 0)
        outcome = ledger.BLESSED if code == 0 else ledger.FAILED
        attempt(root, date, outcome, hour=5, stage="Train", reason="it broke")
        return code

    monkeypatch.setattr(catch_up, "run_night", run_night)
    return calls, codes


def dates_of(calls: list[list[str]]) -> list[str]:
    return [next(a[len("--date=") :] for a in c if a.startswith("--date=")) for c in calls]


def test_failed_missing_and_refused_nights_run_oldest_first_as_cron_runs_them(nights, ran, capsys):
    calls, _ = ran
    args = ["--output-root", str(nights), "--since", day(6), "--", "--workers=1"]
    assert catch_up.main(args, today=TODAY) == 0
    assert dates_of(calls) == [day(4), day(3), day(1)]  # not the evaluated ones, nor today's
    assert calls[0][1:6] == ["-m", "pipeline", "FullRun", "--local-scheduler", f"--date={day(4)}"]
    assert calls[0][6:] == [f"--output-root={nights}", "--workers=1"]
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:4] for line in lines] == [
        [day(4), "failed", "->", "blessed"],
        [day(3), "missing", "->", "blessed"],
        [day(1), "refused", "->", "blessed"],
    ]


def test_the_first_night_that_fails_stops_the_rest(nights, ran, capsys):
    calls, codes = ran
    codes[day(3)] = 30
    assert catch_up.main(["--output-root", str(nights), "--since", day(6)], today=TODAY) == 1
    assert dates_of(calls) == [day(4), day(3)]
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith(f"{day(3)}  missing -> failed  exit 30 after ")
    assert lines[1].endswith(": Train: it broke")
    assert lines[2] == f"{day(1)}  refused  not run: stopped at {day(3)}"


def test_a_dry_run_lists_the_nights_and_runs_none(nights, ran, capsys):
    calls, _ = ran
    args = ["--output-root", str(nights), "--since", day(3), "--dry-run"]
    assert catch_up.main(args, today=TODAY) == 0
    assert calls == []
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[:2] for line in lines] == [[day(3), "missing"], [day(1), "refused"]]
    assert lines[0].endswith(
        f"would run: python -m pipeline FullRun --local-scheduler "
        f"--date={day(3)} --output-root={nights}"
    )


def test_nothing_to_do_says_so(nights, ran, capsys):
    assert catch_up.main(["--output-root", str(nights), "--until", day(5)], today=TODAY) == 0
    assert ran[0] == [] and capsys.readouterr().out.startswith("nothing to catch up from ")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--since", "2026-02-01", "--until", "2026-01-31"], "--since 2026-02-01 is after"),
        (["--since", "2026-1-5"], "--since"),
    ],
)
def test_bad_dates_are_one_line_and_exit_2(nights, ran, capsys, args, says):
    with pytest.raises(SystemExit) as stopped:
        catch_up.main(["--output-root", str(nights), *args], today=TODAY)
    assert stopped.value.code == 2 and ran[0] == []
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: python -m pipeline catch-up: ") and says in line


def test_a_folder_that_is_not_an_output_root_is_one_line_and_exit_2(tmp_path, ran, capsys):
    assert catch_up.main(["--output-root", str(tmp_path / "nothing")], today=TODAY) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: ") and "is not an output root" in line and ran[0] == []


def test_status_names_the_catch_up_command_for_what_it_shows(nights, capsys):
    args = ["--output-root", str(nights), "--today", day(0), "--nights", "4"]
    assert status.main(args) == 1
    err = capsys.readouterr().err
    assert err.strip() == (
        f"2 nights to rerun ({day(3)} missing, {day(1)} refused); in date order: "
        f"python -m pipeline catch-up --since {day(3)} --until {day(0)} --output-root {nights}"
    )
    assert json.loads(_json_of(args, capsys))["catch_up"].startswith(
        f"python -m pipeline catch-up --since {day(3)}"
    )


def _json_of(args: list[str], capsys) -> str:
    status.main([*args, "--json"])
    return capsys.readouterr().out


def test_status_of_evaluated_nights_names_no_command(nights, capsys):
    status.main(["--output-root", str(nights), "--today", day(2), "--nights", "1"])
    assert capsys.readouterr().err == ""


def test_a_real_catch_up_runs_each_night_and_stops_at_a_refused_one(tmp_path, capfd):
    """Through `python -m pipeline catch-up` and real FullRuns: a night already evaluated on
    disk is found done, the next is refused (another run holds its date) and stops the rest."""
    attempt(tmp_path, day(3), ledger.BLESSED)
    evaluated(tmp_path, day(2))  # no attempt recorded: missing
    lock = run_lock.RunLock(str(tmp_path / day(1)))
    lock.acquire()
    try:
        args = ["catch-up", f"--output-root={tmp_path}", f"--since={day(3)}", f"--until={day(0)}"]
        code = pipeline_main.main(args)
    finally:
        lock.release()
    assert code == 1
    lines = capfd.readouterr().out.splitlines()
    assert lines[0].startswith(f"{day(2)}  missing -> skipped-complete  exit 0 after ")
    assert lines[1].startswith(f"{day(1)}  missing -> refused  exit 35 after ")
    assert "already in progress" in lines[1]
    assert lines[2] == f"{day(0)}  missing  not run: stopped at {day(1)}"
    recorded = [(r["date"], r["outcome"]) for r in ledger.read(str(tmp_path))]
    assert recorded[1:] == [(day(2), ledger.SKIPPED_COMPLETE), (day(1), ledger.REFUSED)]
