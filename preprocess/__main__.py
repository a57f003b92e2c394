"""Command line: `python -m preprocess [run] FLAGS` and `python -m preprocess verify DATA_DIR`."""

from __future__ import annotations

import logging
import sys

from contract import layout, manifest, run_lock, storage
from contract.messages import (
    EXIT_BAD_INPUT,
    EXIT_DISK_FULL,
    StageArgumentParser,
    error_line,
    no_space_left,
)
from contract.storage import UnsupportedStorageError

USAGE = """usage: python -m preprocess [run] --output_root DIR [stage flags] [Beam flags]
       python -m preprocess verify DATA_DIR [--split SPLIT] [--worker N]

  run      shard a dataset (see `python -m preprocess run --help`)
  verify   re-check a shard set's files against its manifest
"""


def verify(argv: list[str]) -> int:
    """Checks a shard set; prints OK or the one-line problem; returns the exit code."""
    parser = StageArgumentParser(prog="python -m preprocess verify")
    parser.add_argument("data_dir", help="the shard set's folder (<output_root>/<date>/data)")
    parser.add_argument("--split", default=None, help="only this split's files")
    parser.add_argument("--worker", type=int, default=None, help="only this worker's train files")
    args = parser.parse_args(argv)
    if args.split is not None and args.split not in layout.SPLITS:
        print(error_line(f"unknown split '{args.split}': one of {', '.join(layout.SPLITS)}"),
              file=sys.stderr)  # fmt: skip
        return EXIT_BAD_INPUT
    try:
        doc = manifest.verify(args.data_dir, args.split, args.worker)
    except manifest.ManifestError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"OK: {len(doc['files'])} files in {args.data_dir} match the manifest")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Dispatches to `run` (the default) or `verify`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv and argv[0] == "verify":
        return verify(argv[1:])
    if argv and argv[0] == "run":
        argv = argv[1:]
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from preprocess.config import parse_command_line
    from preprocess.errors import BadInputError, PreprocessError

    try:
        cfg, beam_args = parse_command_line(argv)
        run_lock.hold_for_process(layout.run_dir(storage.absolute(cfg.output_root), cfg.date))
        # The job, and TensorFlow with it, only once the flags are good and the date is ours.
        from preprocess.pipeline import run_preprocess

        run_preprocess(cfg, beam_args)
    except (UnsupportedStorageError, BadInputError) as e:  # refused; nothing published
        print(error_line(str(e)), file=sys.stderr)
        return EXIT_BAD_INPUT
    except (PreprocessError, run_lock.RunLockedError) as e:
        print(error_line(str(e)), file=sys.stderr)
        return 1
    except Exception as e:
        if not no_space_left(e):
            raise
        # Nothing was published: the shard set is written to staging and moved in last.
        print(
            error_line(
                f"no space left on device writing the shard set of {cfg.date} under "
                f"{cfg.output_root}: free space (`python -m pipeline gc` removes what "
                "[Retention] lets go) and rerun; nothing was published"
            ),
            file=sys.stderr,
        )
        return EXIT_DISK_FULL
    return 0


if __name__ == "__main__":
    sys.exit(main())
