"""docker/reuse_bytecode.py: the image reuses a venv's .pyc only where Python would load it."""

from __future__ import annotations

import importlib.util
import os
import py_compile
import subprocess
import sys

from tests.factories import PROJECT_ROOT

spec = importlib.util.spec_from_file_location(
    "reuse_bytecode", PROJECT_ROOT / "docker" / "reuse_bytecode.py"
)
reuse_bytecode = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reuse_bytecode)

MAGIC = importlib.util.MAGIC_NUMBER.hex()
TAG = sys.implementation.cache_tag


def compiled(path) -> None:
    py_compile.compile(
        str(path), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP
    )


def test_valid_bytecode_is_linked_and_the_rest_is_listed(tmp_path):
    host, rootfs = tmp_path / "host", tmp_path / "rootfs"
    image = rootfs / "opt" / "site"
    (host / "pkg").mkdir(parents=True)
    (image / "pkg").mkdir(parents=True)
    for name, text in {
        "same": "def f():\n    return 1\n",
        "edited": "X = 1\n",
        "bare": "Y = 2\n",
    }.items():
        (host / "pkg" / f"{name}.py").write_text(text)
    compiled(host / "pkg" / "same.py")
    compiled(host / "pkg" / "edited.py")
    # The image holds the very files (hard links, as uv installs from one cache), but one was
    # edited after the host compiled it: its .pyc no longer matches.
    os.link(host / "pkg" / "same.py", image / "pkg" / "same.py")
    os.link(host / "pkg" / "bare.py", image / "pkg" / "bare.py")
    (image / "pkg" / "edited.py").write_text("X = 12345\n")
    missing = tmp_path / "missing.txt"

    code = reuse_bytecode.main([str(host), str(rootfs), "/opt/site", MAGIC, TAG, str(missing)])

    assert code == 0
    linked = image / "pkg" / "__pycache__" / f"same.{TAG}.pyc"
    ours = host / "pkg" / "__pycache__" / f"same.{TAG}.pyc"
    assert linked.is_file() and os.path.samefile(linked, ours)
    assert not (image / "pkg" / "__pycache__" / f"edited.{TAG}.pyc").exists()
    assert sorted(missing.read_text().split()) == [
        "/opt/site/pkg/bare.py",
        "/opt/site/pkg/edited.py",
    ]
    # Python loads the linked bytecode as the image's own, under the image's file name.
    probe = subprocess.run(
        [sys.executable, "-v", "-c", "from pkg import same; print(same.f.__code__.co_filename)"],
        cwd=image,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(image)},
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.strip() == str(image / "pkg" / "same.py")
    assert f"{linked} matches {image / 'pkg' / 'same.py'}" in probe.stderr


def test_another_pythons_bytecode_is_not_linked(tmp_path):
    host, rootfs = tmp_path / "host", tmp_path / "rootfs"
    (host / "pkg").mkdir(parents=True)
    (rootfs / "site" / "pkg").mkdir(parents=True)
    (host / "pkg" / "same.py").write_text("Z = 3\n")
    compiled(host / "pkg" / "same.py")
    os.link(host / "pkg" / "same.py", rootfs / "site" / "pkg" / "same.py")
    missing = tmp_path / "missing.txt"
    other_magic = bytes([importlib.util.MAGIC_NUMBER[0] ^ 1]).hex() + MAGIC[2:]

    assert (
        reuse_bytecode.main([str(host), str(rootfs), "/site", other_magic, TAG, str(missing)]) == 0
    )

    assert not (rootfs / "site" / "pkg" / "__pycache__").exists()
    assert missing.read_text().split() == ["/site/pkg/same.py"]
