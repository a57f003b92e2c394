"""Bad flags of `python -m evaluate` give one `error: ...` line and exit 2, no traceback."""

from __future__ import annotations

import pytest

from contract.messages import ERROR_PREFIX, EXIT_BAD_INPUT
from evaluate.__main__ import main


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--batch-size", "0", "batch_size"),
        ("--min-accuracy", "1.5", "min_accuracy"),
        ("--max-regression", "-0.1", "max_regression"),
    ],
)
def test_bad_flag_is_one_error_line(
    tmp_path, capsys: pytest.CaptureFixture[str], flag: str, value: str, named: str
) -> None:
    code = main(["--output-root", str(tmp_path), "--date", "2026-01-31", flag, value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_BAD_INPUT
    assert len(err) == 1
    assert err[0].startswith(ERROR_PREFIX)
    assert named in err[0] and value in err[0]
    assert "Traceback" not in err[0]
