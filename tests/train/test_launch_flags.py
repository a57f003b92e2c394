"""`python -m train launch`'s own flags: a bad value is one `error:` line and exit 2."""

from __future__ import annotations

import subprocess

import pytest

from contract.messages import ERROR_PREFIX, EXIT_BAD_INPUT
from tests.factories import PROJECT_ROOT
from tests.tensorflow_probe import NOT_LOADED_LINE, probe_argv
from tests.train.conftest import SMALL_RUN, history, train_env, write_small_shard_set
from train import __main__ as cli


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    """A small two-worker shard set that the tests only read: the flags fail before it is used."""
    path = str(tmp_path_factory.mktemp("flags") / "data")
    write_small_shard_set(path)
    return path


@pytest.fixture
def launch_argv(data_dir, tmp_path):
    """A valid launch command line on a small two-worker shard set, without the flag under test."""
    argv = ["launch", "--data-dir", data_dir, "--train-dir", str(tmp_path / "train")]
    for name, value in SMALL_RUN.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--num-workers", "2", "--max-restarts", "-1"], "--max-restarts must be 0 or more"),
        (["--num-workers", "0"], "--num-workers must be at least 1, got 0"),
        (["--num-workers", "2", "--ports", "12x,13"], "expected comma-separated port numbers"),
        (["--num-workers", "2", "--ports", "23456"], "--ports lists 1 ports for 2 workers"),
        (["--num-workers", "2", "--ports", "23456,23456"], "--ports must be distinct ports"),
        (["--num-workers", "2", "--ports", "0,70000"], "--ports must be distinct ports"),
        (["--num-workers", "2", "--backend", "docker"], "--backend docker needs --image"),
        (["--num-workers", "2", "--backend", "cloud"], "invalid choice: 'cloud'"),
    ],
)
def test_bad_launch_flag_is_one_line_and_exit_2(capsys, launch_argv, tmp_path, flags, message):
    assert cli.main([*launch_argv, *flags]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(ERROR_PREFIX), err
    assert message in err[0]
    assert not (tmp_path / "train").exists()  # nothing started


def test_docker_workers_with_a_gs_train_dir_are_refused(capsys, launch_argv):
    argv = [a if a != launch_argv[4] else "gs://bucket/runs/2026-01-31/train" for a in launch_argv]
    flags = ["--num-workers", "2", "--backend", "docker", "--image", "img:latest"]
    assert cli.main([*argv, *flags]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(ERROR_PREFIX), err
    assert "--backend docker needs a local --train-dir, got gs://bucket" in err[0]


@pytest.mark.e2e
def test_the_launcher_trains_without_loading_tensorflow_itself(launch_argv, data_dir, tmp_path):
    # Only the workers load it: the launcher's checks, start and watch need none of it, nor
    # does settling a warm start that finds no blessed model (the first night). One worker on
    # a shard set of its own: what is watched is the launcher, not the cluster.
    solo_data_dir = str(tmp_path / "solo")
    write_small_shard_set(solo_data_dir, num_workers=1)
    train_dir = str(tmp_path / "runs" / "2026-01-31" / "train")
    swap = {str(tmp_path / "train"): train_dir, data_dir: solo_data_dir}
    argv = [swap.get(a, a) for a in launch_argv]
    flags = ["--num-workers", "1", "--epochs", "1", "--warm-start", "last-blessed"]
    proc = subprocess.run(
        probe_argv("train", *argv, *flags),
        cwd=PROJECT_ROOT,
        env=train_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = history(train_dir)
    assert doc["epochs_completed"] == 1
    assert doc["warm_start"]["cold_start_reason"].startswith("no blessed model yet")
    assert proc.stdout.splitlines()[-1] == NOT_LOADED_LINE
