"""Command line that rewrites the trend page: `python -m evaluate.rewrite_trend --output-root runs`.

Every evaluation already does this; by hand it is for after a night was deleted or moved.
"""

from __future__ import annotations

import argparse
import logging
import sys

from contract import layout
from evaluate import trend


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    parser = argparse.ArgumentParser(
        prog="python -m evaluate.rewrite_trend",
        description="Rewrite <output-root>/index.html and trend.png from the evaluated nights.",
    )
    parser.add_argument("--output-root", required=True, help="folder with one subfolder per date")
    args = parser.parse_args(argv)
    nights = trend.update_page(args.output_root)
    print(f"{layout.join(args.output_root, trend.INDEX_FILE)}: {len(nights)} nights")
    return 0


if __name__ == "__main__":
    sys.exit(main())
