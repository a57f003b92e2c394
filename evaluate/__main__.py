"""Command line of the evaluate stage: `python -m evaluate --output-root runs --date 2026-01-31`."""

from __future__ import annotations

import argparse
import logging
import sys

from contract import layout, run_lock
from contract.manifest import ManifestError
from contract.messages import EXIT_BAD_INPUT, EXIT_FAILED, error_line
from evaluate.config import EvaluateConfig
from evaluate.data import EvalSplitError
from evaluate.stage import TrainOutputError, run

logger = logging.getLogger("evaluate")


def parse_args(argv: list[str] | None = None) -> EvaluateConfig:
    """Parses the command line into the stage's config."""
    parser = argparse.ArgumentParser(
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
        help="largest accuracy drop against the last blessed run (fraction: 0.01 = one point)",
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
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = parse_args(argv)
    except ValueError as e:
        print(error_line(f"{e}; fix the flag and rerun"), file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        run_lock.hold_for_process(layout.run_dir(config.output_root, config.date))
        metrics = run(config)
    except (
        ManifestError,
        EvalSplitError,
        TrainOutputError,
        ValueError,
        run_lock.RunLockedError,
    ) as e:
        print(error_line(str(e)), file=sys.stderr)
        return EXIT_FAILED
    print(
        f"accuracy {metrics['accuracy']:.4f}, loss {metrics['loss']:.4f}, "
        f"blessed {metrics['blessed']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
