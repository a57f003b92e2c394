"""pipeline.executor without a Docker engine: command parsing, mounts, users, config."""

from __future__ import annotations

import os
import sys

import luigi
import pytest

from pipeline import executor
from pipeline.executor import DockerExecutor, DockerSettings, DockerWorkerBackend, ExecutorError


def settings(tmp_path, mounts=("runs", ".cache/sources:ro", "gs://bucket/runs"), user=""):
    return DockerSettings("img:tag", tuple(mounts), user, 2222, str(tmp_path))


def test_split_stage_command():
    stage, args = executor.split_stage_command([sys.executable, "-m", "evaluate", "--date", "d"])
    assert (stage, args) == ("evaluate", ["--date", "d"])


def test_split_stage_command_names_what_it_expected():
    with pytest.raises(ExecutorError, match=r"expected a stage command \[python, -m, stage"):
        executor.split_stage_command(["luigi", "FullRun"])


def test_mounts_resolve_against_the_working_folder(tmp_path):
    assert settings(tmp_path).volumes() == [
        (str(tmp_path / "runs"), False),
        (str(tmp_path / ".cache" / "sources"), True),
    ]


def test_run_args_mount_each_folder_at_its_own_path(tmp_path):
    args = settings(tmp_path, user="1234:99").run_args("name", {"stage": "train"}, {"A": "b"})
    runs = str(tmp_path / "runs")
    sources = str(tmp_path / ".cache" / "sources")
    assert f"{runs}:{runs}" in args and f"{sources}:{sources}:ro" in args
    assert args[args.index("--workdir") + 1] == str(tmp_path)
    assert args[args.index("--user") + 1] == "1234:99"
    assert "A=b" in args and "HOME=/tmp" in args
    assert "nightly-trainer.stage=train" in args


@pytest.mark.parametrize(
    ("uid", "configured", "expected"),
    [(1234, "", "1234:4321"), (0, "", "1000:1000"), (0, "0:0", "0:0"), (1234, "5:6", "5:6")],
)
def test_containers_run_as_the_invoker_or_the_image_user_for_root(
    monkeypatch, tmp_path, uid, configured, expected
):
    monkeypatch.setattr(os, "getuid", lambda: uid)
    monkeypatch.setattr(os, "getgid", lambda: 4321)
    assert settings(tmp_path, user=configured).resolved_user() == expected


def test_prepare_volumes_creates_writable_mounts(tmp_path):
    (tmp_path / ".cache" / "sources").mkdir(parents=True)
    settings(tmp_path, user=f"{os.getuid()}:{os.getgid()}").prepare_volumes()
    assert (tmp_path / "runs").is_dir()


def test_prepare_volumes_names_a_missing_read_only_mount(tmp_path):
    with pytest.raises(ExecutorError, match=r"read-only mount .*sources does not exist"):
        settings(tmp_path).prepare_volumes()


def test_missing_engine_is_reported_with_the_way_out(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker command at all
    with (
        open(tmp_path / "log", "wb") as log,
        pytest.raises(ExecutorError, match=r"set \[executor\] kind = local"),
    ):
        DockerExecutor(settings(tmp_path)).call([sys.executable, "-m", "evaluate"], log)


def test_worker_containers_are_named_after_the_train_folder(tmp_path):
    def backend(train_dir):
        return DockerWorkerBackend(settings(tmp_path), ["python"], train_dir, str(tmp_path))

    first, again, other = backend("runs/a/train"), backend("runs/a/train"), backend("runs/b/train")
    assert first.container_name(1) == again.container_name(1)
    assert first.container_name(1).endswith("-worker-1")
    assert first.container_name(1) != other.container_name(1)
    assert first.network == first.prefix + "-net"


def test_local_executor_runs_the_command_into_the_log(tmp_path):
    source = tmp_path / "doc.json"
    source.write_text('{"a": 1}')
    with open(tmp_path / "log", "wb") as log:
        code = executor.LocalExecutor().call([sys.executable, "-m", "json.tool", str(source)], log)
    assert code == 0
    assert '"a": 1' in (tmp_path / "log").read_text()


@pytest.fixture
def luigi_config():
    config = luigi.configuration.get_config()
    added = [s for s in ("executor", "docker") if not config.has_section(s)]
    for section in added:
        config.add_section(section)
    saved = {s: dict(config.items(s)) for s in ("executor", "docker")}
    yield config
    for section, values in saved.items():
        for key in list(config.options(section)):
            if key not in values:
                config.remove_option(section, key)
        for key, value in values.items():
            config.set(section, key, value)
    for section in added:
        config.remove_section(section)


def test_kind_in_luigi_cfg_picks_the_executor(luigi_config):
    luigi_config.set("executor", "kind", "local")
    assert isinstance(executor.executor_from_config(), executor.LocalExecutor)
    luigi_config.set("executor", "kind", "docker")
    luigi_config.set("docker", "image", "other:1")
    luigi_config.set("docker", "mounts", '["data", "src:ro"]')
    chosen = executor.executor_from_config()
    assert isinstance(chosen, DockerExecutor)
    assert chosen.settings.image == "other:1"
    assert chosen.settings.mounts == ("data", "src:ro")
