"""Runs every benchmark module and prints one Markdown table (`make bench`).

A benchmark module is `bench/bench_<name>.py` with `run() -> list[Result]`. Each result
compares a candidate against a baseline measured in the same process run, so the ratio
holds on whatever machine runs it. The table also goes to bench/results/latest.md.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import pathlib
import platform
import sys

from bench.result import Result

BENCH_DIR = pathlib.Path(__file__).resolve().parent


def machine_line() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def table(results: list[Result]) -> str:
    lines = [
        "| benchmark | candidate | baseline | candidate value | baseline value "
        "| ratio | target | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [r.markdown_row() for r in results]
    notes = [f"- {r.benchmark}: {r.notes}" for r in results if r.notes]
    return "\n".join(lines + ([""] + notes if notes else []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", help="benchmark modules to run (default: all)")
    args = parser.parse_args(argv)
    names = args.names or sorted(p.stem[len("bench_") :] for p in BENCH_DIR.glob("bench_*.py"))
    results: list[Result] = []
    for name in names:
        module = importlib.import_module(f"bench.bench_{name}")
        print(f"running bench_{name} ...", file=sys.stderr, flush=True)
        results.extend(module.run())
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = f"Measured {stamp} on {machine_line()}.\n\n{table(results)}\n"
    out = BENCH_DIR / "results"
    out.mkdir(exist_ok=True)
    (out / "latest.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
