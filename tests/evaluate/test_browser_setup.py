"""The browser test's set-up says why it skips when Chromium cannot be had."""

from __future__ import annotations

import subprocess

import pytest

from tests.evaluate import browser


def _which(present: set[str]):
    return lambda name: f"/usr/bin/{name}" if name in present else None


def test_no_chromium_and_no_apt_get_is_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browser.shutil, "which", _which(set()))
    assert browser.find_or_install_chromium() == (
        None,
        "chromium is not on PATH and there is no apt-get to install it",
    )


def test_a_failed_install_is_retried_after_update_and_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[list[str]] = []

    def apt_get(command, **kwargs):
        ran.append(command)
        return subprocess.CompletedProcess(
            command, 100, "", "Reading package lists...\nE: Unable to locate package chromium\n"
        )

    monkeypatch.setattr(browser.shutil, "which", _which({"apt-get"}))
    monkeypatch.setattr(browser.os, "geteuid", lambda: 0)
    monkeypatch.setattr(browser.subprocess, "run", apt_get)
    path, reason = browser.find_or_install_chromium()
    # apt waits for dpkg's lock when another install holds it, rather than failing at once.
    apt_get_waiting = ["apt-get", "-o", "DPkg::Lock::Timeout=900"]
    install = [*apt_get_waiting, "install", "-y", "--no-install-recommends", "chromium"]
    assert ran == [install, [*apt_get_waiting, "update"], install]
    assert path is None
    assert reason == (
        "chromium is not on PATH and `apt-get -o DPkg::Lock::Timeout=900 install -y "
        "--no-install-recommends chromium` failed (exit 100): E: Unable to locate package chromium"
    )


def test_not_root_installs_through_sudo_without_a_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[list[str]] = []

    def sudo(command, **kwargs):
        ran.append(command)
        return subprocess.CompletedProcess(command, 1, "", "sudo: a password is required\n")

    monkeypatch.setattr(browser.shutil, "which", _which({"apt-get", "sudo"}))
    monkeypatch.setattr(browser.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(browser.subprocess, "run", sudo)
    path, reason = browser.find_or_install_chromium()
    assert path is None and ran[0][:2] == ["sudo", "-n"]
    assert reason.endswith("failed (exit 1): sudo: a password is required")
