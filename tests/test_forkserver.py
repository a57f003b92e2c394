"""The warm fork server: a program forked from it is what `python -m` would have started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from contract import spawn
from contract.forkserver import ENV
from tests.factories import PROJECT_ROOT
from tests.waiting import wait_until

# Its own: this file's server imports only what its probe needs, so it starts in a second.
OWN_PROCESSES = True

PROBE = textwrap.dedent(
    """
    import gc, os, sys
    print("frozen", gc.get_freeze_count() > 0)
    print("argv", sys.argv[1:], "cwd", os.getcwd(), "colour", os.environ.get("COLOUR"))
    print("loaded", "json" in sys.modules, "comm", open("/proc/self/comm").read().strip())
    print("group", os.getpgid(0) == os.getpid(), "session", os.getsid(0) == os.getpid())
    if len(sys.argv) > 2:
        os.write(int(sys.argv[2]), b"through the kept descriptor")
    print("error: the probe's own error line", file=sys.stderr)
    sys.exit(int(sys.argv[1]))
    """
)


@pytest.fixture
def server(tmp_path):
    """A fork server that preloads `json`, and a folder with the probe module in it."""
    (tmp_path / "probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != ENV}
    with spawn.serving(str(tmp_path), env, preload=["json"]) as served:
        yield served, tmp_path


def run_probe(env, *args, **kwargs) -> tuple[spawn.Process, str]:
    process = spawn.popen(
        [sys.executable, "-m", "probe", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **kwargs,
    )
    assert process.stdout is not None
    output = process.stdout.read().decode()
    process.wait(60)
    return process, output


def test_a_forked_program_has_its_argv_env_cwd_streams_descriptors_and_exit_code(
    server, monkeypatch
):
    env, folder = server
    monkeypatch.chdir(folder)
    read_end, write_end = os.pipe()
    cpu_before = spawn.forked_usage()[0]
    try:
        process, output = run_probe(
            env | {"COLOUR": "green"},
            "3",
            str(write_end),
            pass_fds=[write_end],
        )
        os.close(write_end)
        kept = os.read(read_end, 100)
    finally:
        os.close(read_end)
    assert isinstance(process, spawn.Forked)
    assert process.returncode == 3
    assert f"argv ['3', '{write_end}'] cwd {folder} colour green" in output
    assert "loaded True comm probe" in output  # preloaded by the server, named as the module
    assert "frozen True" in output  # what the server imported is out of the collector's walk
    # Always a session of its own, never the group of whoever started the server.
    assert "group True session True" in output
    assert "error: the probe's own error line" in output
    assert kept == b"through the kept descriptor"
    assert spawn.forked_usage()[0] > cpu_before  # its CPU is counted as a child's would be


@pytest.mark.parametrize("import_env", [{}, {"TF_ENABLE_ONEDNN_OPTS": "0"}], ids=["forked", "own"])
def test_a_program_runs_in_the_folder_it_is_given_forked_or_not(server, import_env):
    env, folder = server
    assert os.getcwd() != str(folder)
    process, output = run_probe(env | import_env, "0", cwd=str(folder))
    assert isinstance(process, spawn.Forked if not import_env else subprocess.Popen)
    assert process.returncode == 0
    assert f"cwd {folder} colour None" in output  # `-m probe` found from that folder too


@pytest.mark.parametrize(
    "setting",
    # TensorFlow's kernels, and its gs:// file system's read buffer: both read at its import.
    [("TF_ENABLE_ONEDNN_OPTS", "0"), ("GCS_READ_CACHE_BLOCK_SIZE_MB", "16")],
    ids=lambda setting: setting[0],
)
def test_a_program_whose_import_time_environment_differs_starts_as_its_own_process(
    server, monkeypatch, setting
):
    env, folder = server
    monkeypatch.chdir(folder)
    process, output = run_probe(env | dict([setting]), "0")
    assert isinstance(process, subprocess.Popen)
    assert process.returncode == 0
    assert "loaded False comm python" in output  # a fresh interpreter: nothing preloaded


def test_pythonpath_is_searched_first_and_may_not_shadow_what_the_server_loaded(
    server, tmp_path, monkeypatch
):
    env, folder = server
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    process, output = run_probe(env | {"PYTHONPATH": str(folder)}, "0")
    assert isinstance(process, spawn.Forked)
    assert "loaded True" in output  # found through PYTHONPATH, in the forked program
    (folder / "json.py").write_text("raise SystemExit('the shadowing json was imported')")
    process, output = run_probe(env | {"PYTHONPATH": str(folder)}, "0")
    assert isinstance(process, subprocess.Popen)  # a fresh python would import that json
    assert "loaded False comm python" in output


def test_without_a_server_the_program_starts_as_its_own_process(tmp_path, monkeypatch):
    (tmp_path / "probe.py").write_text(PROBE)
    monkeypatch.chdir(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != ENV}
    process, output = run_probe(env | {ENV: str(tmp_path / "nobody.sock")}, "4")
    assert isinstance(process, subprocess.Popen)
    assert process.returncode == 4
    assert "argv ['4']" in output


def test_run_gives_the_exit_code_and_output_forked_or_not(server, monkeypatch):
    env, folder = server
    monkeypatch.chdir(folder)
    forked_before = spawn.forked_usage()[0]
    done = spawn.run([sys.executable, "-m", "probe", "5"], env=env)
    assert (done.returncode, done.stderr) == (5, "error: the probe's own error line\n")
    assert spawn.forked_usage()[0] > forked_before  # the server ran it
    alone = {k: v for k, v in env.items() if k != ENV}
    done = spawn.run([sys.executable, "-m", "probe", "0"], env=alone)
    assert (done.returncode, done.stderr) == (0, "error: the probe's own error line\n")


CALLER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    sys.path.insert(0, sys.argv[1])
    from contract import spawn
    program = spawn.popen(
        [sys.executable, "-m", "sleeper"], death_signal=signal.SIGTERM,
        stdout=subprocess.DEVNULL,
    )
    print(type(program).__name__, program.pid, flush=True)
    time.sleep(600)
    """
)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_program_gets_its_death_signal_when_its_caller_is_killed(server, tmp_path):
    env, folder = server
    (folder / "sleeper.py").write_text("import time\ntime.sleep(600)\n")
    caller = subprocess.Popen(
        [sys.executable, "-c", CALLER, str(PROJECT_ROOT)],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert caller.stdout is not None
    kind, pid = caller.stdout.readline().split()
    assert kind == "Forked"
    os.kill(caller.pid, signal.SIGKILL)
    caller.wait()
    wait_until(
        lambda: gone(int(pid)),
        timeout=30,
        failure=lambda: f"the forked program {pid} outlived its killed caller",
    )


def test_a_program_whose_server_stops_reads_as_killed(tmp_path, monkeypatch):
    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(600)\n")
    monkeypatch.chdir(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != ENV}
    with spawn.serving(str(tmp_path), env, preload=["json"]) as served:
        program = spawn.popen([sys.executable, "-m", "sleeper"], env=served)
        assert isinstance(program, spawn.Forked)
        with pytest.raises(subprocess.TimeoutExpired):
            program.wait(0.2)
        assert program.poll() is None
    assert program.wait(30) == -signal.SIGKILL
