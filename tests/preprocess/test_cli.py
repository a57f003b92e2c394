"""The command line: `verify` names the first bad file; bad input is one line, no traceback."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from contract import layout
from contract.messages import EXIT_BAD_INPUT, EXIT_DISK_FULL
from preprocess import __main__ as cli
from tests import factories


def flip_byte(path: str, offset: int = 100) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_verify_ok(shard_set, capsys):
    data_dir, _ = shard_set
    assert cli.main(["verify", data_dir]) == 0
    assert capsys.readouterr().out.startswith("OK: 4 files")


@pytest.mark.slow
def test_verify_names_a_flipped_byte(shard_set):
    data_dir, _ = shard_set
    flip_byte(os.path.join(data_dir, layout.whole_split_file_name("validation", 0, 1)))
    result = subprocess.run(
        [sys.executable, "-m", "preprocess", "verify", data_dir],
        capture_output=True,
        text=True,
        cwd=factories.PROJECT_ROOT,
    )
    assert result.returncode == 1
    assert "checksum mismatch" in result.stderr and "validation-00000-of-00001" in result.stderr
    assert "Traceback" not in result.stderr


def test_verify_names_a_missing_file(shard_set, capsys):
    data_dir, _ = shard_set
    os.remove(os.path.join(data_dir, layout.worker_file_name(1, 2, 0, 1)))
    assert cli.main(["verify", data_dir]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: shard file missing: ") and "worker-00001-of-00002" in err


def test_verify_one_worker_only(shard_set, capsys):
    data_dir, _ = shard_set
    flip_byte(os.path.join(data_dir, layout.worker_file_name(0, 2, 0, 1)))
    assert cli.main(["verify", data_dir, "--split", "train", "--worker", "1"]) == 0
    assert cli.main(["verify", data_dir, "--split", "train", "--worker", "0"]) == 1


@pytest.mark.slow
def test_run_bad_input_is_one_line_without_traceback(tiny_tfds, tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "preprocess",
            "run",
            f"--output_root={tmp_path}",
            f"--data_dir={tiny_tfds}",
            "--num_workers=0",
        ],
        capture_output=True,
        text=True,
        cwd=factories.PROJECT_ROOT,
    )
    assert result.returncode == EXIT_BAD_INPUT
    assert result.stderr.strip().splitlines()[-1] == "error: num_workers must be at least 1, got 0"
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--dataset=no_such_dataset"], "error: unknown TFDS dataset 'no_such_dataset'"),
        (["--validation_fraction=1.5"], "error: validation_fraction must be in [0, 1), got 1.5"),
        (["--num_workers=1000"], "error: num_workers 1000 is larger than the 270 training"),
        (["--validation_fraction=nan"], "error: validation_fraction must be in [0, 1), got nan"),
        (["--eval_fraction=inf"], "error: eval_fraction must be in (0, 1), got inf"),
        (["--seed=-1"], "error: seed must be 0 or more, got -1"),
        (
            ["--num_worker=4"],
            "error: unknown argument(s) --num_worker=4 (did you mean --num_workers?): neither",
        ),
        (
            ["--runer", "DirectRunner"],
            "error: unknown argument(s) --runer (did you mean --runner?)",
        ),
    ],
)
def test_run_bad_input_messages(make_config, capsys, flags, message):
    cfg = make_config()
    argv = [f"--output_root={cfg.output_root}", f"--data_dir={cfg.data_dir}", "--date", cfg.date]
    argv += flags
    assert cli.main(["run", *argv]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err.startswith(message)
    assert not os.path.exists(layout.data_dir(cfg.output_root, "2026-01-31"))


@pytest.mark.parametrize(
    "flags, code, message",
    [
        (["--split", "trian"], 2, "error: unknown split 'trian': one of train, validation, eval"),
        (["--worker", "0"], 1, "error: --worker selects train files: pass --split train"),
        (["--split", "train", "--worker", "2"], 1, "error: worker 2 is not in this shard set"),
    ],
)
def test_verify_refuses_a_selection_that_checks_nothing(shard_set, capsys, flags, code, message):
    data_dir, _ = shard_set
    assert cli.main(["verify", data_dir, *flags]) == code
    captured = capsys.readouterr()
    assert captured.err.startswith(message) and captured.err.count("\n") == 1
    assert "OK" not in captured.out


@pytest.mark.parametrize(
    "beam_flags",
    [
        ["--runner=DirectRunner", "--direct_num_workers", "2"],
        ["--direct_running_mode=multi_processing"],
        ["--runner", "DaskRunner", "--dask_client_address=tcp://127.0.0.1:8786"],
        ["--runner=DataflowRunner", "--project=p", "--region=r", "--temp_location=gs://b/t"],
    ],
)
def test_every_runners_flags_pass_the_unknown_flag_check(beam_flags):
    import argparse

    from preprocess.config import add_arguments, check_beam_flags

    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_arguments(parser)
    _, rest = parser.parse_known_args(["--output_root=runs", *beam_flags])
    assert rest == beam_flags
    check_beam_flags(rest, parser)


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        # How a runner hands back a worker's failure: its own error, raised from the OSError.
        "wrapped",
    ],
)
def test_a_full_disk_is_one_line_and_exit_3_with_nothing_published(
    make_config, capsys, monkeypatch, error
):
    from preprocess import pipeline

    def fill_the_disk(cfg, beam_args):
        os.makedirs(layout.run_dir(cfg.output_root, cfg.date), exist_ok=True)
        if error != "wrapped":
            raise error
        try:
            with open("/dev/full", "wb") as full:
                full.write(b"x")
                full.flush()
        except OSError as e:
            raise RuntimeError("WriteToTFRecord failed [while running 'Write/Shard']") from e

    monkeypatch.setattr(pipeline, "run_preprocess", fill_the_disk)
    cfg = make_config()
    argv = [f"--output_root={cfg.output_root}", f"--data_dir={cfg.data_dir}", "--date", cfg.date]
    assert cli.main(["run", *argv]) == EXIT_DISK_FULL
    err = capsys.readouterr().err
    assert err.startswith("error: no space left on device writing the shard set of 2026-01-31")
    assert len(err.strip().splitlines()) == 1 and "nothing was published" in err
    assert not os.path.exists(
        layout.join(layout.data_dir(cfg.output_root, cfg.date), "manifest.json")
    )


def test_an_error_that_is_not_a_full_disk_is_not_called_one():
    from contract.messages import no_space_left

    assert not no_space_left(RuntimeError("the worker died"))
    assert not no_space_left(OSError(errno.EACCES, "Permission denied"))
    try:
        raise RuntimeError("the pipeline failed") from OSError(errno.EACCES, "Permission denied")
    except RuntimeError as e:
        assert not no_space_left(e)
