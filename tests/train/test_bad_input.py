"""Bad input stops training with one clear line and a non-zero exit, before any damage."""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import socket
import subprocess

import pytest

from contract import layout, manifest
from contract.messages import ERROR_PREFIX
from tests import forked
from tests.train.conftest import SMALL_RUN, train_env, write_small_shard_set
from train import ONEDNN_ENV, cluster
from train import __main__ as cli
from train.config import TrainConfig
from train.launcher import worker_argv
from train.local_backend import free_ports
from train.restarts import BAD_INPUT_EXIT_CODE


def launch_args(data_dir: str, train_dir: str, **overrides) -> list[str]:
    settings = {**SMALL_RUN, "num_workers": 2, **overrides}
    argv = ["launch", "--data-dir", data_dir, "--train-dir", train_dir]
    for name, value in settings.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


@pytest.fixture(scope="module")
def pristine_data_dir(tmp_path_factory) -> str:
    """A valid small shard set, written once; each test works on its own copy (see `dirs`)."""
    path = str(tmp_path_factory.mktemp("bad_input") / "data")
    write_small_shard_set(path)
    return path


@pytest.fixture
def dirs(pristine_data_dir, tmp_path):
    """A valid small shard set (some tests break it) and a train folder holding a backup that
    must survive."""
    data_dir, train_dir = str(tmp_path / "data"), str(tmp_path / "train")
    shutil.copytree(pristine_data_dir, data_dir)
    backup = os.path.join(train_dir, layout.BACKUP_DIR, "chief")
    os.makedirs(backup)
    with open(os.path.join(backup, "checkpoint"), "w") as f:
        f.write("sentinel")
    return data_dir, train_dir


def fails_with(capsys, argv: list[str], message: str, code: int = BAD_INPUT_EXIT_CODE) -> str:
    assert cli.main(argv) == code
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(ERROR_PREFIX)]
    assert len(lines) == 1 and message in lines[0], lines
    return lines[0]


def backup_intact(train_dir: str) -> bool:
    with open(os.path.join(train_dir, layout.BACKUP_DIR, "chief", "checkpoint")) as f:
        return f.read() == "sentinel" and not os.path.exists(
            os.path.join(train_dir, layout.HISTORY_FILE)
        )


def test_missing_manifest(capsys, dirs):
    data_dir, train_dir = dirs
    os.remove(os.path.join(data_dir, layout.MANIFEST_FILE))
    fails_with(capsys, launch_args(data_dir, train_dir), "manifest not found")
    assert backup_intact(train_dir)


def test_corrupt_manifest(capsys, dirs):
    data_dir, train_dir = dirs
    with open(os.path.join(data_dir, layout.MANIFEST_FILE), "w") as f:
        f.write('{"schema_version": 1, "files": [')
    fails_with(capsys, launch_args(data_dir, train_dir), "manifest is not valid JSON")
    assert backup_intact(train_dir)


def test_worker_count_mismatch(capsys, dirs):
    data_dir, train_dir = dirs
    line = fails_with(capsys, launch_args(data_dir, train_dir, num_workers=3), "num_workers is 3")
    assert "cut for 2 workers" in line
    assert backup_intact(train_dir)


def test_unknown_model(capsys, dirs):
    data_dir, train_dir = dirs
    fails_with(
        capsys,
        launch_args(data_dir, train_dir, model="resnet9000"),
        "unknown model 'resnet9000': choose one of cnn, cnn2, cnn3, mlp",
    )
    assert backup_intact(train_dir)


def test_epochs_below_one(capsys, dirs):
    data_dir, train_dir = dirs
    fails_with(
        capsys, launch_args(data_dir, train_dir, epochs=0), "epochs must be at least 1, got 0"
    )
    assert backup_intact(train_dir)


def test_port_in_use(capsys, dirs):
    data_dir, train_dir = dirs
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = launch_args(data_dir, train_dir) + ["--ports", f"{port},{port + 1}"]
        fails_with(capsys, argv, f"port {port} on 127.0.0.1 is in use", code=1)
    assert backup_intact(train_dir)


@pytest.mark.slow
def test_shard_checksum_mismatch_names_the_file(capsys, dirs):
    data_dir, train_dir = dirs
    shard_manifest = manifest.read_manifest(data_dir)
    (bad,) = manifest.shard_paths_for_worker(data_dir, shard_manifest, 1)
    with open(bad, "r+b") as f:  # same size, different bytes
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    line = fails_with(
        capsys, launch_args(data_dir, train_dir), "worker 1 rejected its input", code=1
    )
    assert f"shard file checksum mismatch: {bad}" in line
    assert "worker-1.log" in line
    assert backup_intact(train_dir)


def test_batch_larger_than_a_workers_examples(capsys, dirs):
    data_dir, train_dir = dirs
    fails_with(
        capsys,
        launch_args(data_dir, train_dir, per_worker_batch_size=1000),
        "per_worker_batch_size 1000 exceeds the 256 examples each worker holds",
    )
    assert backup_intact(train_dir)


def refusals(configs: list[TrainConfig], envs: list[dict[str, str]]) -> list[str]:
    """Starts one worker per config by hand with TF_CONFIG, as a TFJob does, and returns the
    one error line each printed; every worker must exit with the bad-input code."""
    addresses = [f"127.0.0.1:{port}" for port in free_ports(len(configs))]

    def worker(index: int) -> subprocess.CompletedProcess[str]:
        tf_config = cluster.tf_config_json(addresses, index)
        env = train_env(**{cluster.TF_CONFIG_ENV: tf_config, **envs[index]})
        return forked.run(worker_argv(configs[index]), env=env, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(len(configs)) as pool:
        workers = list(pool.map(worker, range(len(configs))))
    refused = []
    for done in workers:
        stderr = done.stderr
        assert done.returncode == BAD_INPUT_EXIT_CODE, stderr[-2000:]
        lines = [line for line in stderr.splitlines() if line.startswith(ERROR_PREFIX)]
        assert len(lines) == 1, stderr[-2000:]
        refused.append(lines[0])
    return refused


@pytest.mark.slow
def test_workers_started_with_different_settings_refuse_to_train(dirs):
    """A TFJob starts each pod with its own flags: here worker 1 got another learning rate
    and a policy of its own (what --precision auto can settle on where CPUs differ)."""
    data_dir, train_dir = dirs
    same = {**SMALL_RUN, "data_dir": data_dir, "train_dir": train_dir}
    configs = [
        TrainConfig(**same, precision="float32"),
        TrainConfig(**{**same, "learning_rate": 0.01}, precision="mixed_bfloat16"),
    ]
    for index, line in enumerate(refusals(configs, [{}, {}])):
        assert f"worker {index} and worker(s) {1 - index} were started with different " in line
        assert "learning_rate, precision" in line
        assert f"precision={configs[index].precision!r}" in line
        assert "name the policy instead of --precision auto" in line
    assert backup_intact(train_dir)


@pytest.mark.slow
def test_workers_running_other_cpu_kernels_refuse_to_train(dirs):
    """The same flags, but worker 1 runs TensorFlow's Eigen kernels (TF_ENABLE_ONEDNN_OPTS=0)
    and worker 0 oneDNN's: each would round differently, so they refuse to train together."""
    data_dir, train_dir = dirs
    config = TrainConfig(**SMALL_RUN, data_dir=data_dir, train_dir=train_dir)
    envs = [{ONEDNN_ENV: "1"}, {ONEDNN_ENV: "0"}]
    for index, line in enumerate(refusals([config, config], envs)):
        kernels = "oneDNN" if index == 0 else "Eigen"
        assert (
            f"were started with different kernels (worker {index} has kernels={kernels!r})" in line
        )
        assert "set TF_ENABLE_ONEDNN_OPTS alike for every worker" in line
    assert backup_intact(train_dir)


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("seed", "-1", "seed must be 0 or more, got -1"),
        ("reduce_lr_factor", "1.0", "reduce_lr_factor must be in (0, 1)"),
        ("reduce_lr_factor", "0", "reduce_lr_factor must be in (0, 1)"),
        ("reduce_lr_factor", "-0.5", "reduce_lr_factor must be in (0, 1)"),
        ("reduce_lr_patience", "-1", "reduce_lr_patience must be 0 (off) or more, got -1"),
        ("early_stopping_patience", "-2", "early_stopping_patience must be 0 (off) or more"),
        ("learning_rate", "inf", "learning_rate must be a finite number, got inf"),
        ("learning_rate", "nan", "learning_rate must be a finite number, got nan"),
        ("collective_timeout_seconds", "inf", "collective_timeout_seconds must be a finite"),
        ("label_smoothing", "nan", "label_smoothing must be a finite number"),
        ("reduce_lr_factor", "nan", "reduce_lr_factor must be a finite number"),
    ],
)
def test_settings_out_of_range_are_one_line_before_any_work(capsys, dirs, setting, value, message):
    data_dir, train_dir = dirs
    fails_with(capsys, launch_args(data_dir, train_dir, **{setting: value}), message)
    assert backup_intact(train_dir)
    assert not os.path.exists(os.path.join(train_dir, "logs"))
