"""A flag of the wrong type is one `error: ...` line and exit 2 on every stage's command line,
not argparse's usage block."""

from __future__ import annotations

import importlib

import pytest

from contract.messages import EXIT_BAD_INPUT


@pytest.mark.parametrize(
    "module, argv, prog, flag",
    [
        ("preprocess.__main__", ["run", "--num_workers", "abc"], "preprocess run", "--num_workers"),
        ("preprocess.__main__", ["verify"], "preprocess verify", "data_dir"),
        (
            "preprocess.data_gate",
            ["--label_drift_threshold", "x"],
            "preprocess.data_gate",
            "--label",
        ),
        ("preprocess.make_drops", ["--days", "x"], "preprocess.make_drops", "--days"),
        ("train.__main__", ["launch", "--num-workers", "x"], "train launch", "--num-workers"),
        ("evaluate.__main__", ["--batch-size", "x"], "evaluate", "--batch-size"),
    ],
)
def test_a_bad_flag_is_one_error_line_and_exit_2(capsys, module, argv, prog, flag):
    main = importlib.import_module(module).main
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    assert code == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: python -m {prog}: ") and flag in lines[0], lines[0]
    assert lines[0].endswith("(see --help)")
