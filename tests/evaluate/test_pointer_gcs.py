"""The latest pointer on gs:// between hosts: writes carry the generation read (ifGenerationMatch).

Two hosts share no lock, only the bucket. Each "host" here is a process with its own local
state folder (so its own pointer lock), talking to the local GCS emulator (tests.gcs_emulator).
The earlier date's writer reads the pointer and is held until the later date's writer has
moved it; its write then finds another generation, and deciding again on the pointer as it now
is, it leaves the pointer on the later date. Without the precondition it moved it backwards.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import uuid

import pytest

from contract import pointer, storage
from tests import gcs_emulator
from tests.waiting import wait_until

BUCKET = "bucket"
EARLIER, LATER = "2026-01-31", "2026-02-01"


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """The emulator on free loopback ports; yields the clients' environment."""
    with gcs_emulator.running(tmp_path_factory.mktemp("gcs"), BUCKET) as env:
        yield env


@pytest.fixture
def root(gcs, monkeypatch, tmp_path) -> str:
    """A fresh gs:// output root, with this process (and its children) using the emulator."""
    for name, value in gcs.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(storage.STATE_DIR_ENV, str(tmp_path / "state"))
    return f"gs://{BUCKET}/{uuid.uuid4().hex}/runs"


def night(date: str) -> dict:
    return {
        "date": date,
        "model_path": f"{date}/train/model.keras",
        "metrics_path": f"{date}/evaluate/metrics.json",
        "accuracy": 0.9,
    }


def test_a_write_needs_the_generation_it_read(root):
    assert pointer.read_versioned(root) == (None, 0)
    pointer.write(root, night(EARLIER), if_generation=0)
    current, generation = pointer.read_versioned(root)
    assert current is not None and current["date"] == EARLIER and generation
    with pytest.raises(pointer.PointerMovedError, match="moved by another writer"):
        pointer.write(root, night(LATER), if_generation=0)  # "create it" when it exists
    pointer.write(root, night(LATER), if_generation=generation)
    with pytest.raises(pointer.PointerMovedError):
        pointer.write(root, night(EARLIER), if_generation=generation)  # that generation is gone
    assert pointer.read(root)["date"] == LATER  # type: ignore[index]


def _host(root: str, date: str, state_dir: str, markers: str) -> None:
    """One host's evaluation of `date` moving the pointer: it takes the pointer unless the
    pointer names a later date (as evaluate decides). The earlier date's host is held after
    its first read until the later date's host has moved the pointer."""
    from contract import dates

    os.environ[storage.STATE_DIR_ENV] = state_dir
    reads = []

    def decide(current: dict | None) -> dict | None:
        reads.append(current)
        if date == EARLIER and len(reads) == 1:
            open(os.path.join(markers, "earlier-read"), "w").close()
            wait_until(
                lambda: os.path.exists(os.path.join(markers, "later-moved")),
                timeout=120,
                failure=lambda: "the later date's host never moved the pointer",
            )
        if current is not None and dates.is_later(current["date"], date):
            return None
        return night(date)

    pointer.update(root, decide)
    if date == LATER:
        open(os.path.join(markers, "later-moved"), "w").close()
    with open(os.path.join(markers, f"{date}.json"), "w") as f:
        json.dump(reads, f)


def test_two_hosts_racing_never_move_the_pointer_backwards(root, tmp_path):
    pointer.write(root, night("2026-01-30"), if_generation=0)
    markers = tmp_path / "markers"
    markers.mkdir()
    spawn = multiprocessing.get_context("spawn")
    hosts = {
        date: spawn.Process(
            target=_host, args=(root, date, str(tmp_path / f"host-{date}"), str(markers))
        )
        for date in (EARLIER, LATER)
    }
    hosts[EARLIER].start()
    try:
        wait_until(
            lambda: (markers / "earlier-read").exists(),
            timeout=120,
            failure=lambda: "the earlier date's host never read the pointer",
            alive=hosts[EARLIER].is_alive,
        )
        hosts[LATER].start()
        for host in hosts.values():
            host.join(timeout=180)
    finally:
        for host in hosts.values():
            if host.is_alive():
                host.kill()
    assert [host.exitcode for host in hosts.values()] == [0, 0]
    assert pointer.read(root)["date"] == LATER  # type: ignore[index]
    # The earlier host read twice: its write was refused, and it decided again on the later.
    reads = json.loads((markers / f"{EARLIER}.json").read_text())
    assert [r["date"] for r in reads] == ["2026-01-30", LATER]
