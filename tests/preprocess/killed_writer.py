"""`python -m tests.preprocess.killed_writer DATA_DIR`: a shard-set writer that makes its
staging folder for DATA_DIR and is then killed (SIGKILL), its lock dying with it."""

from __future__ import annotations

import os
import signal
import sys

from preprocess import shard_set


def main() -> None:
    shard_set.make_staging(sys.argv[1])
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
