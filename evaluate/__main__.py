"""Command line of the evaluate stage: `python -m evaluate --output-root runs --date 2026-01-31`."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import NoReturn

from contract import layout, pointer, run_lock
from contract.manifest import ManifestError
from contract.messages import EXIT_BAD_INPUT, EXIT_FAILED, error_line
from evaluate.config import DEFAULT_MODEL_NAME, EvaluateConfig
from evaluate.data import EvalSplitError
from evaluate.serving import ExportBaseError, ExportError
from evaluate.stage import TrainOutputError, run

logger = logging.getLogger("evaluate")


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are the stages' one line, `error: ...`, and exit 2."""

    def error(self, message: str) -> NoReturn:
        print(error_line(f"{self.prog}: {message} (see --help)"), file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_INPUT)


def parse_args(argv: list[str] | None = None) -> EvaluateConfig:
    """Parses the command line into the stage's config."""
    parser = _Parser(
        prog="python -m evaluate",
        description="Evaluate a run's final model on the whole eval split, write metrics, "
        "pictures, report and blessing, and move the latest pointer when blessed.",
    )
    parser.add_argument("--output-root", required=True, help="folder with one subfolder per date")
    parser.add_argument("--date", required=True, help="the run's date, YYYY-MM-DD")
    parser.add_argument("--dataset", default="fashion_mnist", help="dataset the manifest must name")
    parser.add_argument("--batch-size", type=int, default=1000, help="examples per inference batch")
    parser.add_argument(
        "--min-accuracy", type=float, default=None, help="absolute accuracy needed for blessing"
    )
    parser.add_argument(
        "--max-regression",
        type=float,
        default=None,
        help="largest accuracy drop against the last blessed model scored on this run's eval "
        "set (0.01 = one point)",
    )
    parser.add_argument(
        "--max-relative-regression",
        type=float,
        default=None,
        help="largest accuracy drop against that baseline as a fraction of its accuracy "
        "(0.01 = 1%% of it)",
    )
    parser.add_argument(
        "--export-base",
        default=None,
        help="where blessed models are pushed for TF Serving, as "
        "<export-base>/<model-name>/<YYYYMMDD>/ (default <output-root>/serving)",
    )
    parser.add_argument(
        "--model-name",
        default=DEFAULT_MODEL_NAME,
        help="the served model's name, a folder under the export base",
    )
    args = parser.parse_args(argv)
    # EvaluateConfig checks the ranges (batch size >= 1, fractions in [0, 1]); main turns
    # its ValueError into the stage's one error line.
    return EvaluateConfig(
        output_root=args.output_root,
        date=args.date,
        dataset=args.dataset,
        batch_size=args.batch_size,
        min_accuracy=args.min_accuracy,
        max_regression=args.max_regression,
        max_relative_regression=args.max_relative_regression,
        export_base=args.export_base,
        model_name=args.model_name,
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = parse_args(argv)
    except SystemExit as e:  # --help (0), or a bad flag (already reported in one line)
        return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
    except ValueError as e:
        print(error_line(f"{e}; fix the flag and rerun"), file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        run_lock.hold_for_process(layout.run_dir(config.output_root, config.date))
        metrics = run(config)
    except ExportBaseError as e:
        print(error_line(str(e)), file=sys.stderr)
        return EXIT_BAD_INPUT
    except (
        ExportError,
        ManifestError,
        EvalSplitError,
        TrainOutputError,
        ValueError,
        run_lock.RunLockedError,
        pointer.PointerMovedError,
    ) as e:
        print(error_line(str(e)), file=sys.stderr)
        return EXIT_FAILED
    print(
        f"accuracy {metrics['accuracy']:.4f}, loss {metrics['loss']:.4f}, "
        f"blessed {metrics['blessed']}, pushed {metrics['push']['pushed']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
