"""The flags an operator's command takes to name what it acts on: the output root, where the
served versions live and the served model's name (`rollback`, `gc`)."""

from __future__ import annotations

import argparse

DEFAULT_OUTPUT_ROOT = "runs"  # luigi.cfg's [Preprocess] output_root as shipped


def add_flags(
    parser: argparse.ArgumentParser, defaults: dict[str, str], default_model_name: str
) -> None:
    """Adds --output-root, --export-base and --model-name, defaulting to `defaults` (luigi.cfg's
    values, as a night would use them)."""
    parser.add_argument(
        "--output-root",
        default=defaults.get("output_root", DEFAULT_OUTPUT_ROOT),
        help="The output root (default: luigi.cfg's [Preprocess] output_root).",
    )
    parser.add_argument(
        "--export-base",
        default=defaults.get("export_base"),
        help="Where served versions live (default: luigi.cfg's [Evaluate] export_base, else "
        "<output_root>/serving).",
    )
    parser.add_argument(
        "--model-name",
        default=defaults.get("model_name", default_model_name),
        help="The served model's name.",
    )
