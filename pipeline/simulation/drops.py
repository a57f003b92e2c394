"""The simulation's daily drops: cut once by make_drops, spoilt for one night by a fault."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator

from contract import spawn
from contract.messages import last_error
from pipeline.simulation import faults
from pipeline.simulation.config import Settings
from pipeline.simulation.inspector import INVERT, Inspector
from preprocess import make_drops

# A corrupt drop keeps this share of its bytes: cut inside a record, as a copy cut short.
CORRUPT_KEEP = 0.6
RECORD_LENGTH_BYTES = 8
DROP_FAULTS = (faults.CORRUPT_DROP, faults.DRIFTED_DROP)


class DropError(RuntimeError):
    """The drops could not be cut; the message is make_drops' own error line."""


def cut(settings: Settings, source_dir: str) -> None:
    """Runs `python -m preprocess.make_drops` for every night into `<root>/drops`, forked from
    the simulation's fork server (TensorFlow and its datasets already imported) when one serves.

    Raises:
        DropError: make_drops failed.
    """
    command = [
        sys.executable, "-m", "preprocess.make_drops", f"--out={settings.drops}",
        f"--days={settings.nights}", f"--start={settings.start}", f"--seed={settings.seed}",
        f"--per_day={settings.per_day}", f"--test_examples={settings.test_examples}",
        f"--source_dir={source_dir}",
    ]  # fmt: skip
    done = spawn.run(command)
    if done.returncode != 0:
        raise DropError(
            last_error(done.stderr.splitlines())
            or f"make_drops exited {done.returncode}: {done.stderr.strip()[-300:]}"
        )


def inside_a_record(path: str, share: float) -> int:
    """A length that cuts the TFRecord file at `path` in the middle of the record that holds
    byte `share` of it (a cut between records would leave a shorter, valid file)."""
    offset, size, target = 0, os.path.getsize(path), int(os.path.getsize(path) * share)
    with open(path, "rb") as f:
        while True:
            header = f.read(RECORD_LENGTH_BYTES)
            if len(header) < RECORD_LENGTH_BYTES:
                return max(1, target)
            # A record: its length (8 bytes, little-endian), the length's CRC, the data, the
            # data's CRC (4 bytes each).
            record = RECORD_LENGTH_BYTES + 4 + int.from_bytes(header, "little") + 4
            if offset + record > target or offset + record >= size:
                return offset + record // 2
            offset += record
            f.seek(offset)


@contextlib.contextmanager
def spoilt(
    settings: Settings, inspector: Inspector, date: str, night_faults: tuple[str, ...]
) -> Iterator[str | None]:
    """The night's drop spoilt as its fault says while the block runs, then delivered again
    as it was; yields what was done to it (None: no drop fault that night)."""
    fault = next((f for f in night_faults if f in DROP_FAULTS), None)
    if fault is None:
        yield None
        return
    path = settings.drop_file(date)
    saved = os.path.join(settings.root, "faults", f"{date}-{os.path.basename(path)}")
    os.makedirs(os.path.dirname(saved), exist_ok=True)
    shutil.copy2(path, saved)
    try:
        if fault == faults.CORRUPT_DROP:
            size, cut_at = os.path.getsize(path), inside_a_record(path, CORRUPT_KEEP)
            os.truncate(path, cut_at)
            yield f"drop cut to {cut_at} of {size} bytes, inside a record"
        else:
            examples = inspector.ask({"op": INVERT, "path": path})["examples"]
            # Delivered as a drop is, with its sums: the data gate, not the sums, must stop it.
            make_drops.write_sums(os.path.dirname(path))
            yield f"the drop's {examples} images inverted"
    finally:
        os.replace(saved, path)
        if fault == faults.DRIFTED_DROP:
            make_drops.write_sums(os.path.dirname(path))
