"""`python -m tests.upload_folder SOURCE TARGET`: copies a local folder to TARGET (a gs://
path too) with contract.gfile, as a process of its own with the environment it is given."""

from __future__ import annotations

import sys

from contract import gfile


def main() -> None:
    gfile.upload_folder(sys.argv[1], sys.argv[2])


if __name__ == "__main__":
    main()
