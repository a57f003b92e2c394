"""Links the bytecode `make setup` compiled into an image's venv where it is valid there.

docker/assemble_image.sh installs the lock into the image's files from the same uv cache as
`make setup`, hard-linked, so most of the image's modules are the very files of the project's
venv. A `.pyc` is valid for a module when its header names the image Python's magic number
and the module's modification time and size (the timestamp-based form pip and uv write);
Python then loads it and sets the code's file names to where the module is, so compiling
again would write the same bytes. Each valid `.pyc` is hard-linked into the image's
`__pycache__`; the modules left without one are listed, for the image's Python to compile.

Usage: python3 docker/reuse_bytecode.py HOST_SITE_PACKAGES ROOTFS SITE_PACKAGES MAGIC_HEX \
           CACHE_TAG MISSING_LIST
SITE_PACKAGES is the venv's folder inside the image (under ROOTFS) and MAGIC_HEX and
CACHE_TAG are its Python's (`importlib.util.MAGIC_NUMBER.hex()`, `sys.implementation.cache_tag`).
MISSING_LIST receives the modules (paths inside the image) that still need compiling.
"""

from __future__ import annotations

import os
import struct
import sys

HEADER = struct.Struct("<4sIII")  # magic, flags (0: timestamp-based), mtime, size


def valid_for(pyc: str, magic: bytes, source: os.stat_result) -> bool:
    """Whether the `.pyc` file holds a timestamp-based header that matches `source`."""
    try:
        with open(pyc, "rb") as f:
            header = f.read(HEADER.size)
    except OSError:
        return False
    if len(header) != HEADER.size:
        return False
    got_magic, flags, mtime, size = HEADER.unpack(header)
    return (
        got_magic == magic
        and flags == 0
        and mtime == int(source.st_mtime) & 0xFFFFFFFF
        and size == source.st_size & 0xFFFFFFFF
    )


def link_bytecode(host: str, image: str, magic: bytes, tag: str) -> tuple[int, list[str]]:
    """Links every valid `.pyc` of `host` into `image`; returns how many were linked and the
    image's modules (relative to `image`) left without bytecode."""
    linked, missing = 0, []
    suffix = f".{tag}.pyc"
    for root, dirs, files in os.walk(image):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel = os.path.relpath(root, image)
        for name in files:
            if not name.endswith(".py"):
                continue
            module = os.path.join(root, name)
            pyc_name = name[:-3] + suffix
            target = os.path.join(root, "__pycache__", pyc_name)
            if os.path.exists(target):
                continue
            source = os.stat(module)
            ours = os.path.normpath(os.path.join(host, rel, "__pycache__", pyc_name))
            if valid_for(ours, magic, source):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                try:
                    os.link(ours, target)
                    linked += 1
                    continue
                except OSError:
                    pass
            missing.append(os.path.normpath(os.path.join(rel, name)))
    return linked, missing


def main(argv: list[str]) -> int:
    if len(argv) != 6:
        print("usage: reuse_bytecode.py HOST_SITE_PACKAGES ROOTFS SITE_PACKAGES MAGIC_HEX "
              "CACHE_TAG MISSING_LIST", file=sys.stderr)  # fmt: skip
        return 2
    host, rootfs, site_packages, magic_hex, tag, missing_list = argv
    image = os.path.join(rootfs, site_packages.lstrip("/"))
    linked, missing = link_bytecode(host, image, bytes.fromhex(magic_hex), tag)
    with open(missing_list, "w") as f:
        f.writelines(f"{os.path.join(site_packages, path)}\n" for path in missing)
    print(f"reuse_bytecode: linked {linked} .pyc files, {len(missing)} modules to compile")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
