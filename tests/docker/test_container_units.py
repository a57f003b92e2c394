"""Containers without a Docker engine: command lines, mounts, users, config, the launcher flag."""

from __future__ import annotations

import os
import sys

import luigi
import pytest

from contract.containers import ContainerError, ContainerSettings
from pipeline import config, docker_run
from tests.factories import PROJECT_ROOT
from train import __main__ as train_cli
from train.docker_backend import DockerWorkerBackend


def settings(tmp_path, mounts=("runs", ".cache/sources:ro", "gs://bucket/runs"), user=""):
    return ContainerSettings("img:tag", tuple(mounts), user, str(tmp_path))


def test_split_stage_command():
    stage, args = docker_run.split_stage_command([sys.executable, "-m", "evaluate", "--date", "d"])
    assert (stage, args) == ("evaluate", ["--date", "d"])


def test_split_stage_command_names_what_it_expected():
    with pytest.raises(
        docker_run.StageCommandError, match=r"expected a stage command \[python, -m, stage"
    ):
        docker_run.split_stage_command(["luigi", "FullRun"])


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


@pytest.fixture
def planted_links(tmp_path):
    """A runs folder holding links (as a container could plant) to a folder and a file outside
    it, both owned by a uid that is neither root's nor the image user's."""
    if os.getuid() != 0:
        pytest.skip("handing mounts over (chown) happens only when run as root")
    outside = tmp_path / "outside"
    (outside / "train" / "logs").mkdir(parents=True)
    (outside / "secret").write_text("x")
    for path in (outside, outside / "train", outside / "train" / "logs", outside / "secret"):
        os.chown(path, 4242, 4242)
    run = tmp_path / "runs" / "2026-01-31"
    (run / "train").mkdir(parents=True)
    (run / "train" / "history.json").write_text("{}")
    (run / "to-folder").symlink_to(outside)
    (run / "to-file").symlink_to(outside / "secret")
    (tmp_path / "runs" / "2026-02-01").symlink_to(outside)
    return outside


def _owners(outside) -> set[int]:
    return {p.stat().st_uid for p in [outside, *outside.rglob("*")]}


def test_prepare_volumes_never_follows_a_link_out_of_the_mount(tmp_path, planted_links):
    settings(tmp_path, mounts=("runs",)).prepare_volumes()
    assert _owners(planted_links) == {4242}
    run = tmp_path / "runs" / "2026-01-31"
    assert (run / "train" / "history.json").stat().st_uid == 1000  # the run's own files are
    assert (run / "train").stat().st_uid == 1000 and run.stat().st_uid == 1000  # handed over
    assert (run / "to-folder").lstat().st_uid == 0  # the link itself is left as it is


def test_hand_over_stops_at_a_link_on_the_way_down(tmp_path, planted_links):
    ours = tmp_path / "runs" / "2026-01-31" / "train"
    container = settings(tmp_path, mounts=("runs",))
    container.hand_over(str(tmp_path / "runs" / "2026-02-01" / "train" / "logs"))
    container.hand_over(str(ours))
    assert _owners(planted_links) == {4242}
    assert ours.stat().st_uid == 1000 and (tmp_path / "runs").stat().st_uid == 1000


def test_prepare_volumes_names_a_missing_read_only_mount(tmp_path):
    with pytest.raises(ContainerError, match=r"read-only mount .*sources does not exist"):
        settings(tmp_path).prepare_volumes()


def test_missing_engine_is_reported_with_the_way_out(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker command at all
    with pytest.raises(ContainerError, match=r"set \[Executor\] kind = local"):
        docker_run.container_command([sys.executable, "-m", "evaluate"], settings(tmp_path))


def test_missing_engine_fails_the_docker_launcher_in_one_line(tmp_path, monkeypatch, capsys):
    from tests.train.conftest import SMALL_RUN, write_small_shard_set

    data_dir = str(tmp_path / "data")
    write_small_shard_set(data_dir)
    argv = ["launch", "--data-dir", data_dir, "--train-dir", str(tmp_path / "train")]
    argv += ["--num-workers", "2", "--backend", "docker", "--image", "img:tag"]
    for name, value in SMALL_RUN.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    monkeypatch.setenv("PATH", str(tmp_path))
    assert train_cli.main(argv) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: --backend docker but the Docker engine cannot be reached")
    assert "use --backend local" in line


def test_worker_containers_are_named_after_the_train_folder(tmp_path):
    def backend(train_dir):
        return DockerWorkerBackend(settings(tmp_path), 2222, ["python"], train_dir, str(tmp_path))

    first, again, other = backend("runs/a/train"), backend("runs/a/train"), backend("runs/b/train")
    assert first.container_name(1) == again.container_name(1)
    assert first.container_name(1).endswith("-worker-1")
    assert first.container_name(1) != other.container_name(1)
    assert first.network == first.prefix + "-net"
    assert first.launch_id != again.launch_id  # the reaper removes only its own launch's


def test_stage_container_is_attached_removed_and_signalled(tmp_path, monkeypatch):
    monkeypatch.setattr(docker_run, "require_docker", lambda *_: None)
    (tmp_path / ".cache" / "sources").mkdir(parents=True)
    stage = [sys.executable, "-m", "evaluate", "--date", "d"]
    command, name = docker_run.container_command(stage, settings(tmp_path))
    assert command[:5] == ["docker", "run", "--rm", "--init", "--sig-proxy=true"]
    assert command[-4:] == ["img:tag", "evaluate", "--date", "d"]
    assert command[command.index("--name") + 1] == name and "-evaluate-" in name


@pytest.fixture
def luigi_config():
    cfg = luigi.configuration.get_config()
    added = [s for s in ("Executor", "Docker") if not cfg.has_section(s)]
    for section in added:
        cfg.add_section(section)
    saved = {s: dict(cfg.items(s)) for s in ("Executor", "Docker")}
    yield cfg
    for section, values in saved.items():
        for key in list(cfg.options(section)):
            if key not in values:
                cfg.remove_option(section, key)
        for key, value in values.items():
            cfg.set(section, key, value)
    for section in added:
        cfg.remove_section(section)


def test_kind_in_luigi_cfg_picks_where_stages_run(luigi_config):
    luigi_config.set("Executor", "kind", "local")
    assert config.container_settings() is None
    assert config.train_backend_flags() == []
    luigi_config.set("Executor", "kind", "docker")
    luigi_config.set("Docker", "image", "other:1")
    luigi_config.set("Docker", "mounts", '["data", "src:ro"]')
    chosen = config.container_settings()
    assert chosen is not None
    assert (chosen.image, chosen.mounts) == ("other:1", ("data", "src:ro"))
    flags = config.train_backend_flags()
    assert flags[:4] == ["--backend", "docker", "--image", "other:1"]
    assert flags.count("--docker-mount") == 2


def test_the_image_installs_with_the_uv_that_make_setup_pins():
    # One uv for the venv and the image: the Dockerfile's default is the Makefile's pin.
    pins = {}
    for name, prefix in (("Makefile", "UV_VERSION := "), ("docker/Dockerfile", "ARG UV_VERSION=")):
        lines = (PROJECT_ROOT / name).read_text().splitlines()
        (line,) = [line for line in lines if line.startswith(prefix)]
        pins[name] = line[len(prefix) :].split()[0]
    assert pins["Makefile"] == pins["docker/Dockerfile"], pins
