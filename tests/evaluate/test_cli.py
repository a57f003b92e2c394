"""Bad flags of `python -m evaluate` give one `error: ...` line and exit 2, no traceback."""

from __future__ import annotations

import pytest

from contract.messages import ERROR_PREFIX, EXIT_BAD_INPUT, EXIT_DISK_FULL
from evaluate.__main__ import main


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--batch-size", "0", "batch_size"),
        ("--min-accuracy", "1.5", "min_accuracy"),
        ("--max-regression", "-0.1", "max_regression"),
        ("--max-relative-regression", "1.5", "max_relative_regression"),
        ("--model-name", "../elsewhere", "model_name"),
        ("--export-base", "s3://bucket/serving", "export base"),
        ("--min-accuracy", "nan", "min_accuracy"),
        ("--max-regression", "inf", "max_regression"),
        ("--batch-size", "abc", "--batch-size"),
    ],
)
def test_bad_flag_is_one_error_line(
    tmp_path, capsys: pytest.CaptureFixture[str], flag: str, value: str, named: str
) -> None:
    # A threshold first: an empty rule set is refused on its own (the test below).
    argv = ["--output-root", str(tmp_path), "--date", "2026-01-31", "--min-accuracy", "0"]
    code = main([*argv, flag, value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_BAD_INPUT
    assert len(err) == 1
    assert err[0].startswith(ERROR_PREFIX)
    assert named in err[0] and value in err[0]
    assert "Traceback" not in err[0]


def test_an_empty_rule_set_is_refused_in_one_line_unless_asked_for(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    from evaluate.__main__ import parse_args

    argv = ["--output-root", str(tmp_path), "--date", "2026-01-31"]
    assert main(argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(ERROR_PREFIX)
    assert "no blessing threshold is set" in err[0] and "bless_without_thresholds" in err[0]
    assert not list(tmp_path.iterdir())  # refused before any work
    config = parse_args([*argv, "--bless-without-thresholds"])
    assert config.bless_without_thresholds and config.thresholds.empty
    assert parse_args([*argv, "--confidence", "0.9", "--max-regression", "0.01"]).confidence == 0.9


def test_the_evaluate_task_passes_every_blessing_and_export_setting() -> None:
    import datetime

    from evaluate.__main__ import parse_args
    from pipeline import Evaluate

    task = Evaluate(
        date=datetime.date(2026, 1, 31),
        output_root="/runs",
        dataset="fashion_mnist",
        num_workers=2,
        min_accuracy=0.9,
        max_regression=0.01,
        max_relative_regression=0.02,
        export_base="gs://bucket/serving",
        model_name="shoes",
    )
    config = parse_args(task.command()[3:])
    assert (config.min_accuracy, config.max_regression, config.max_relative_regression) == (
        0.9,
        0.01,
        0.02,
    )
    assert (config.serving_base, config.model_name) == ("gs://bucket/serving", "shoes")
    default = parse_args(
        Evaluate(date=datetime.date(2026, 1, 31), output_root="/runs").command()[3:]
    )
    assert default.serving_base == "/runs/serving"


def test_a_truncated_model_is_named_in_one_line(run_root, capsys) -> None:
    from tests.evaluate.conftest import DATE

    model = run_root / DATE / "train" / "model.keras"
    with open(model, "r+b") as f:
        f.truncate(model.stat().st_size // 2)
    code = main(["--output-root", str(run_root), "--date", DATE, "--min-accuracy", "0"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith(ERROR_PREFIX)]
    assert code != 0
    assert len(err) == 1 and f"model {model} is unreadable" in err[0], err
    assert "rerun the train stage" in err[0]
    assert not (run_root / DATE / "evaluate").exists()


def test_an_unreadable_latest_pointer_is_refused_in_one_line_before_any_work(
    run_root, capsys
) -> None:
    from tests.evaluate.conftest import DATE

    (run_root / "latest.json").write_text("[1, 2")
    code = main(["--output-root", str(run_root), "--date", DATE, "--min-accuracy", "0"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith(ERROR_PREFIX)]
    assert code != 0
    assert len(err) == 1 and "latest pointer" in err[0] and "is unreadable" in err[0], err
    assert not (run_root / DATE / "evaluate").exists()


def test_a_full_disk_is_one_line_and_exit_3_and_the_night_stays_unevaluated(
    run_root, capsys, monkeypatch
) -> None:
    from evaluate import stage
    from tests.evaluate.conftest import DATE

    real_write = stage.atomic.write_bytes_atomic

    def full_disk(path, data, *args, **kwargs):
        if path.endswith(".png"):
            with open("/dev/full", "wb") as full:
                full.write(b"x" * 8192)
                full.flush()
        return real_write(path, data, *args, **kwargs)

    monkeypatch.setattr(stage.atomic, "write_bytes_atomic", full_disk)
    code = main(["--output-root", str(run_root), "--date", DATE, "--min-accuracy", "0"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith(ERROR_PREFIX)]
    assert code == EXIT_DISK_FULL
    assert len(err) == 1 and f"no space left on device evaluating {DATE}" in err[0], err
    assert not (run_root / DATE / "evaluate" / "metrics.json").exists()
    assert not (run_root / "latest.json").exists()
