"""Runs every benchmark module and prints one Markdown table (`make bench`).

A benchmark module is `bench/bench_<name>.py` with `run() -> list[Result]`. Each result
compares a candidate against a baseline measured in the same process run, so the ratio
holds on whatever machine runs it. The table also goes to bench/results/latest.md.
Options given here reach the modules whose `run` takes a parameter of that name
(`python -m bench scale --factors 1,10`).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import inspect
import os
import pathlib
import platform
import sys

from bench.result import Result

BENCH_DIR = pathlib.Path(__file__).resolve().parent


# `--cpu avx2` stands in for an AVX2-only x86 CPU (such as the AMD EPYC VMs in BENCHMARKS.md)
# on a newer one: oneDNN may use nothing past AVX2, and TensorFlow's own choice of kernels is
# taken as Eigen's, as TensorFlow 2.21 picks on such a CPU. Eigen's code in the wheel is
# compiled in, whatever the CPU, so only oneDNN needs the cap.
EMULATED_CPUS = {
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "BENCH_TF_OWN_KERNELS": "0"},
}


def machine_line(cpu: str = "native") -> str:
    line = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    if cpu in EMULATED_CPUS:
        settings = ", ".join(f"{k}={v}" for k, v in EMULATED_CPUS[cpu].items())
        line += f", standing in for an {cpu.upper()}-only CPU ({settings})"
    return line


def table(results: list[Result]) -> str:
    lines = [
        "| benchmark | candidate | baseline | candidate value | baseline value "
        "| ratio | target | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [r.markdown_row() for r in results]
    notes = [f"- {r.benchmark}: {r.notes}" for r in results if r.notes]
    return "\n".join(lines + ([""] + notes if notes else []))


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected whole numbers like 1,10, got {text!r}"
        ) from None


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", help="benchmark modules to run (default: all)")
    parser.add_argument(
        "--factors",
        type=_int_list,
        default=None,
        help="scale: fashion_mnist_scaled factors to compare, e.g. 1,10 (default 1,10,100)",
    )
    parser.add_argument(
        "--runners",
        type=lambda text: tuple(text.split(",")),
        default=None,
        help="scale: Beam runners, direct and/or dask (default both)",
    )
    parser.add_argument(
        "--models",
        type=lambda text: tuple(text.split(",")),
        default=None,
        help="tta: models to time, name or name:precision, e.g. cnn,cnn3:mixed_bfloat16 "
        "(default cnn3:auto, the nightly's)",
    )
    parser.add_argument(
        "--seeds",
        type=_positive_int,
        default=None,
        help="tta: seeds per side, the row compares medians (default 5)",
    )
    parser.add_argument(
        "--recipe",
        choices=["plain", "nightly"],
        default=None,
        help="warm_start: plain (cnn, a constant rate, small nights; default) or nightly "
        "(luigi.cfg's recipe on 27,000 then 54,000 images)",
    )
    parser.add_argument(
        "--sizes",
        type=_int_list,
        default=None,
        help="warm_start: night 1's and night 2's train images, e.g. 6000,10000",
    )
    parser.add_argument("--model", default=None, help="warm_start: the model of both nights")
    parser.add_argument(
        "--warm-rates",
        type=lambda text: tuple(float(part) for part in text.split(",")),
        default=None,
        help="warm_start: the warm night's learning rates to time, one row each (with "
        "--warm-finetunes, or no fine-tune)",
    )
    parser.add_argument(
        "--warm-finetunes",
        type=_int_list,
        default=None,
        help="warm_start: the warm night's fine-tune epochs to time with each of --warm-rates, "
        "one row each (default: the recipe's settings)",
    )
    parser.add_argument(
        "--cpu",
        choices=["native", *EMULATED_CPUS],
        default="native",
        help="avx2: measure as on an AVX2-only CPU (oneDNN capped at AVX2, TensorFlow's own "
        "kernels taken as Eigen's); default: this CPU as it is",
    )
    args = parser.parse_args(argv)
    # Before any module loads TensorFlow; the benchmarks' subprocesses inherit it.
    os.environ.update(EMULATED_CPUS.get(args.cpu, {}))
    options = {k: v for k, v in vars(args).items() if k not in ("names", "cpu") and v is not None}
    names = args.names or sorted(p.stem[len("bench_") :] for p in BENCH_DIR.glob("bench_*.py"))
    results: list[Result] = []
    for name in names:
        module = importlib.import_module(f"bench.bench_{name}")
        print(f"running bench_{name} ...", file=sys.stderr, flush=True)
        accepted = inspect.signature(module.run).parameters
        results.extend(module.run(**{k: v for k, v in options.items() if k in accepted}))
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = f"Measured {stamp} on {machine_line(args.cpu)}.\n\n{table(results)}\n"
    out = BENCH_DIR / "results"
    out.mkdir(exist_ok=True)
    (out / "latest.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
