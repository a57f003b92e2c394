"""`python -m tests.preprocess.prepare_program DATASET DATA_DIR MANUAL_DIR SUMS`: prepares
DATASET in DATA_DIR as the stage does (preprocess.sources) and prints `prepared <data_dir>`."""

from __future__ import annotations

import sys

from preprocess import sources


def main() -> None:
    builder = sources.prepare_dataset(*sys.argv[1:])
    print("prepared", builder.data_dir)


if __name__ == "__main__":
    main()
