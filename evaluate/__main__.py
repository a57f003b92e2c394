"""Command line of the evaluate stage: `python -m evaluate --output-root runs --date 2026-01-31`."""

from __future__ import annotations

import logging
import sys

from contract import layout, pointer, run_lock, settings
from contract.manifest import ManifestError
from contract.messages import (
    EXIT_BAD_INPUT,
    EXIT_DISK_FULL,
    EXIT_FAILED,
    StageArgumentParser,
    error_line,
    no_space_left,
)
from evaluate.config import EvaluateConfig

logger = logging.getLogger("evaluate")


def parse_args(argv: list[str] | None = None) -> EvaluateConfig:
    """Parses the command line into the stage's config."""
    parser = StageArgumentParser(
        prog="python -m evaluate",
        description="Evaluate a run's final model on the whole eval split, write metrics, "
        "pictures, report and blessing, and move the latest pointer when blessed.",
    )
    settings.add_flags(parser, EvaluateConfig)
    args = parser.parse_args(argv)
    # EvaluateConfig checks the ranges (batch size >= 1, fractions in [0, 1]); main turns
    # its ValueError into the stage's one error line.
    config: EvaluateConfig = settings.from_flags(EvaluateConfig, args)
    return config


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
    # The stage, and TensorFlow with it, only now: parse_args serves Luigi's process too.
    from evaluate.data import EvalSplitError
    from evaluate.serving import ExportBaseError, ExportError
    from evaluate.stage import TrainOutputError, run

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
    except Exception as e:
        if not no_space_left(e):
            raise
        # metrics.json, the stage's completion marker, is written last: the night stays
        # unevaluated, and the pointer moves only after it.
        print(
            error_line(
                f"no space left on device evaluating {config.date} under {config.output_root}: "
                "free space (`python -m pipeline gc` removes what [Retention] lets go) and rerun "
                "the evaluate stage; the night is left unevaluated"
            ),
            file=sys.stderr,
        )
        return EXIT_DISK_FULL
    print(
        f"accuracy {metrics['accuracy']:.4f}, loss {metrics['loss']:.4f}, "
        f"blessed {metrics['blessed']}, pushed {metrics['push']['pushed']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
