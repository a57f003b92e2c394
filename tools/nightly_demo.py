"""`python -m tools.nightly_demo`: consecutive nights on growing daily drops, warm-started.

    python -m tools.nightly_demo                  # 3 nights of cnn, 5 epochs, in runs-demo/
    python -m tools.nightly_demo --days 5 --epochs 5 --model cnn3
    python -m tools.nightly_demo --recipe         # luigi.cfg's recipe on the whole train split

It cuts Fashion-MNIST's train split into `--days` seeded daily drops in `<root>/drops`
(`python -m preprocess.make_drops`, the test split beside them as the fixed evaluation set),
then runs `luigi --module pipeline FullRun --local-scheduler` for each drop's date in turn on a
rolling window as long as the demo, so night k trains on the k drops so far, with
`--Train-warm-start last-blessed`: from the second night on, training starts from the model
the latest pointer names. Each night is blessed against that model scored on the same eval set
and a blessed model is pushed to `<root>/serving/nightly/<YYYYMMDDNN>/`. At the end it prints one
row a night; the trend page `<root>/index.html` shows the same.

Every night's luigi output goes to `<root>/demo-logs/<date>.log` (`--verbose` shows it too).
`<root>/demo.json` records the settings: a rerun with the same settings continues where it
stopped (finished nights are complete for luigi and are not run again); other settings are
refused, so a demo's nights always share one set of drops and one recipe.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import time
from typing import Any

from contract import layout, spawn
from contract.messages import EXIT_BAD_INPUT, EXIT_FAILED, error_line, last_error

SETTINGS_FILE = "demo.json"
SUMMARY_FILE = "demo-summary.json"
DROPS_FOLDER = "drops"
LOGS_FOLDER = "demo-logs"
# The evaluate stage's push record, beside blessing.json (evaluate/report.py, PUSH_FILE).
PUSH_FILE = "push.json"
# The recipe the quick demo trains with when --recipe is not given (flags override each).
# A drop of 4,500 is 8 steps an epoch at luigi.cfg's 256 a worker: smaller batches, at the rate
# luigi.cfg pairs with them, give the short runs enough steps.
QUICK = {"per_day": 5000, "model": "cnn", "epochs": 5, "min_accuracy": 0.75}
QUICK_LUIGI_ARGS = ("--Train-per-worker-batch-size=64", "--Train-learning-rate=0.003")


class DemoError(Exception):
    """A setting the demo cannot run with, or a root made by a demo with other settings."""


@dataclasses.dataclass(frozen=True)
class DemoSettings:
    """What a demo runs; None leaves a setting to luigi.cfg (or make_drops' default).

    Attributes:
        root: the demo's output root (its drops, nights, pointer, serving exports, page).
        days: how many drops, and nights.
        start: the first night's date, YYYY-MM-DD.
        seed: seeds the deal of examples into drops.
        per_day: examples per drop; None deals the whole train split.
        test_examples: examples of the fixed evaluation set; None: the whole test split.
        model: the Train model; None: luigi.cfg's.
        epochs: the Train epochs; None: luigi.cfg's.
        num_workers: training workers; None: luigi.cfg's.
        min_accuracy: the blessing's value threshold; None: luigi.cfg's.
        warm_start_learning_rate: the warm nights' peak rate; None: luigi.cfg's.
        luigi_args: further flags for every night's luigi command.
    """

    root: str = "runs-demo"
    days: int = 3
    start: str = "2026-01-01"
    seed: int = 0
    per_day: int | None = None
    test_examples: int | None = None
    model: str | None = None
    epochs: int | None = None
    num_workers: int | None = None
    min_accuracy: float | None = None
    warm_start_learning_rate: float | None = None
    luigi_args: tuple[str, ...] = ()

    def check(self) -> None:
        """Raises DemoError naming the first setting that is out of range."""
        if self.days < 3:
            raise DemoError(
                f"--days must be at least 3 (a demo of several nights), got {self.days}"
            )
        try:
            datetime.date.fromisoformat(self.start)
        except ValueError:
            raise DemoError(f"--start must be YYYY-MM-DD, got '{self.start}'") from None
        if "://" in self.root:
            raise DemoError(f"--root {self.root}: the demo writes to a local folder")
        for name in ("per_day", "test_examples", "epochs", "num_workers"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise DemoError(f"--{name.replace('_', '-')} must be at least 1, got {value}")

    def dates(self) -> list[str]:
        first = datetime.date.fromisoformat(self.start)
        return [(first + datetime.timedelta(days=n)).isoformat() for n in range(self.days)]

    def document(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(self).items()}


def drops_dataset(drops: str) -> str:
    """The --dataset value that reads make_drops' folder: dated train drops, fixed test files."""
    return f"drops:train={drops}/{{YYYY}}-{{MM}}-{{DD}}/*.tfrecord,test={drops}/test/*.tfrecord"


def luigi_command(settings: DemoSettings, date: str) -> list[str]:
    """The night's `luigi --module pipeline FullRun` command."""
    drops = layout.join(settings.root, DROPS_FOLDER)
    command = [
        sys.executable, "-m", "luigi", "--module", "pipeline", "FullRun", "--local-scheduler",
        f"--date={date}", f"--output-root={settings.root}", f"--dataset={drops_dataset(drops)}",
        "--Preprocess-raw-image-shape=28x28x1", f"--Preprocess-window-days={settings.days}",
        # The window fills up night by night on purpose: night k has k of its days.
        "--DataGate-min-window-days=1", "--Train-warm-start=last-blessed",
    ]  # fmt: skip
    optional = (
        ("--num-workers", settings.num_workers),
        ("--Train-model", settings.model),
        ("--Train-epochs", settings.epochs),
        ("--Train-warm-start-learning-rate", settings.warm_start_learning_rate),
        ("--Evaluate-min-accuracy", settings.min_accuracy),
    )
    command += [f"{flag}={value}" for flag, value in optional if value is not None]
    if settings.epochs == 1:
        command.append("--Train-warmup-epochs=0")  # warm-up must end before the last epoch
    return [*command, *settings.luigi_args]


def claim_root(settings: DemoSettings) -> bool:
    """Records the settings in a new root, or checks an existing root's against them.

    Returns:
        True when the root is new (its drops are still to be cut).

    Raises:
        DemoError: the root holds something else, or a demo with other settings.
    """
    path = layout.join(settings.root, SETTINGS_FILE)
    wanted = settings.document()
    if os.path.exists(path):
        recorded = _read(path)
        differing = [
            f"{name} {recorded.get(name)!r} (now {value!r})"
            for name, value in wanted.items()
            if recorded.get(name) != value
        ]
        if differing:
            raise DemoError(
                f"{settings.root} holds a demo with other settings: {', '.join(differing)}. "
                f"Rerun with those, or remove {settings.root} (or pass another --root)"
            )
        return not os.path.isdir(layout.join(settings.root, DROPS_FOLDER))
    if os.path.exists(settings.root) and os.listdir(settings.root):
        raise DemoError(
            f"--root {settings.root} exists and is not a demo's (no {SETTINGS_FILE}): "
            "pass a new folder"
        )
    os.makedirs(settings.root, exist_ok=True)
    _write(path, wanted)
    return True


def cut_drops(settings: DemoSettings) -> None:
    """Runs `python -m preprocess.make_drops` into `<root>/drops`.

    Raises:
        DemoError: make_drops failed; its own error line is the message.
    """
    command = [
        sys.executable, "-m", "preprocess.make_drops",
        f"--out={layout.join(settings.root, DROPS_FOLDER)}", f"--days={settings.days}",
        f"--start={settings.start}", f"--seed={settings.seed}",
    ]  # fmt: skip
    if settings.per_day is not None:
        command.append(f"--per_day={settings.per_day}")
    if settings.test_examples is not None:
        command.append(f"--test_examples={settings.test_examples}")
    print(f"cutting {settings.days} daily drops: python {' '.join(command[1:])}", flush=True)
    done = spawn.run(command)  # forked when a fork server serves
    if done.returncode != 0:
        raise DemoError(
            last_error(done.stderr.splitlines())
            or f"make_drops failed (exit {done.returncode}): {done.stderr.strip()[-300:]}"
        )


def run_night(settings: DemoSettings, date: str, verbose: bool) -> tuple[int, float, str]:
    """Runs one night's FullRun, its output into `<root>/demo-logs/<date>.log`.

    Returns:
        luigi's exit code, the wall time in seconds and the log file's path.
    """
    log_path = os.path.join(settings.root, LOGS_FOLDER, f"{date}.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    command = luigi_command(settings, date)
    started = time.monotonic()
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=os.environ | {"PYTHONUNBUFFERED": "1"},
        )
        assert process.stdout is not None
        for line in process.stdout:
            log.write(line)
            if verbose:
                print(line, end="", flush=True)
        returncode = process.wait()
    return returncode, time.monotonic() - started, log_path


def _read(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return dict(json.load(f))


def _write(path: str, doc: dict[str, Any]) -> None:
    """Writes JSON whole or not at all (the demo's root is local: no TF needed here)."""
    staging = f"{path}.tmp-{os.getpid()}"
    with open(staging, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(staging, path)


def night_summary(root: str, date: str) -> dict[str, Any]:
    """One night's figures from its files: data, starting model, scores, verdict, push."""
    shard_set = _read(layout.join(layout.data_dir(root, date), layout.MANIFEST_FILE))
    history = _read(layout.join(layout.train_dir(root, date), layout.HISTORY_FILE))
    evaluate_dir = layout.evaluate_dir(root, date)
    metrics = _read(layout.join(evaluate_dir, layout.METRICS_FILE))
    verdict = _read(layout.join(evaluate_dir, layout.BLESSING_FILE))
    push = _read(layout.join(evaluate_dir, PUSH_FILE))
    warm_start = history.get("warm_start") or {}
    started_from = (warm_start.get("started_from") or {}).get("run_date")
    baseline = verdict.get("baseline") or {}
    drops = shard_set.get("drops") or {}
    return {
        "date": date,
        "days": len(drops.get("days_read", [])),
        "train_examples": shard_set.get("splits", {}).get("train", {}).get("num_examples"),
        "started_from": started_from or ("cold" if warm_start else None),
        "accuracy": metrics.get("accuracy"),
        "baseline_accuracy": baseline.get("accuracy"),
        "eval_examples": metrics.get("num_examples"),
        "blessed": verdict.get("blessed"),
        "pushed_version": push.get("version") if push.get("pushed") else None,
        "training_seconds": history.get("wall_time_seconds"),
    }


def _cell(value: Any, fmt: str = "{}") -> str:
    return "–" if value is None else fmt.format(value)


def summary_table(rows: list[dict[str, Any]]) -> str:
    """The nights as a plain-text table, one line a night."""
    header = (
        "date", "days", "train ex.", "started from", "accuracy", "baseline", "eval ex.",
        "blessed", "pushed", "train s", "night s",
    )  # fmt: skip
    lines = [header]
    for row in rows:
        blessed = {True: "yes", False: "no"}.get(row["blessed"], "–")
        lines.append(
            (
                row["date"],
                str(row["days"]),
                _cell(row["train_examples"], "{:,}"),
                _cell(row["started_from"]),
                _cell(row["accuracy"], "{:.4f}"),
                _cell(row["baseline_accuracy"], "{:.4f}"),
                _cell(row["eval_examples"], "{:,}"),
                blessed,
                _cell(row["pushed_version"]),
                _cell(row["training_seconds"], "{:.0f}"),
                _cell(row.get("wall_seconds"), "{:.0f}"),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def run(settings: DemoSettings, verbose: bool = False) -> list[dict[str, Any]]:
    """Cuts the drops (once) and runs every night in date order; stops at a failed night.

    Returns:
        One summary a night run (the failed one last, with its `exit_code` and `log`).

    Raises:
        DemoError: a bad setting, a root of another demo, or make_drops failing.
    """
    settings.check()
    if claim_root(settings):
        cut_drops(settings)
    rows = []
    for number, date in enumerate(settings.dates(), start=1):
        print(f"night {number}/{settings.days} {date}: FullRun ...", flush=True)
        returncode, seconds, log_path = run_night(settings, date, verbose)
        row = night_summary(settings.root, date) | {"wall_seconds": seconds}
        rows.append(row)
        if returncode != 0:
            with open(log_path) as log:
                reason = last_error(log.read().splitlines())
            row |= {"exit_code": returncode, "log": log_path, "error": reason}
            break
        blessed = "blessed" if row["blessed"] else "not blessed"
        print(
            f"night {number}/{settings.days} {date}: accuracy {_cell(row['accuracy'], '{:.4f}')}"
            f", {blessed}, started from {row['started_from']}, {seconds:.0f}s (log {log_path})",
            flush=True,
        )
    _write(layout.join(settings.root, SUMMARY_FILE), {"nights": rows})
    return rows


def parse_args(argv: list[str]) -> tuple[DemoSettings, bool]:
    parser = argparse.ArgumentParser(
        prog="python -m tools.nightly_demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--root", default="runs-demo", help="the demo's output root")
    parser.add_argument("--days", type=int, default=3, help="drops and nights (at least 3)")
    parser.add_argument("--start", default="2026-01-01", help="the first night, YYYY-MM-DD")
    parser.add_argument("--seed", type=int, default=0, help="seeds the deal into drops")
    parser.add_argument(
        "--recipe",
        action="store_true",
        help="luigi.cfg's Train and Evaluate settings on the whole train split instead of the "
        "quick demo's (5,000 examples a drop, cnn, 5 epochs, batch 64 a worker at rate 0.003, "
        "min_accuracy 0.75); flags win",
    )
    parser.add_argument("--per-day", type=int, help="examples per drop (--recipe: 60000/days)")
    parser.add_argument("--test-examples", type=int, help="fixed eval examples (default: 10000)")
    parser.add_argument("--model", help="Train model (--recipe: luigi.cfg's)")
    parser.add_argument("--epochs", type=int, help="Train epochs (--recipe: luigi.cfg's)")
    parser.add_argument("--num-workers", type=int, help="training workers (default luigi.cfg's)")
    parser.add_argument("--min-accuracy", type=float, help="blessing's value threshold")
    parser.add_argument(
        "--warm-start-learning-rate", type=float, help="warm nights' peak rate (luigi.cfg's)"
    )
    parser.add_argument("--verbose", action="store_true", help="show each night's luigi output")
    parser.add_argument(
        "luigi_args", nargs="*", help="after --: further flags for every night's luigi command"
    )
    args = parser.parse_args(argv)
    chosen: dict[str, Any] = {} if args.recipe else dict(QUICK)
    chosen |= {name: getattr(args, name) for name in QUICK if getattr(args, name) is not None}
    settings = DemoSettings(
        root=args.root,
        days=args.days,
        start=args.start,
        seed=args.seed,
        test_examples=args.test_examples,
        num_workers=args.num_workers,
        warm_start_learning_rate=args.warm_start_learning_rate,
        luigi_args=(*(() if args.recipe else QUICK_LUIGI_ARGS), *args.luigi_args),
        **chosen,
    )
    return settings, args.verbose


def main(argv: list[str] | None = None) -> int:
    """Command line: runs the demo and prints the nights' table; non-zero when a night fails."""
    settings, verbose = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        rows = run(settings, verbose)
    except DemoError as e:
        print(error_line(str(e)), file=sys.stderr)
        return EXIT_BAD_INPUT
    print()
    print(summary_table(rows))
    print(f"\ntrend page: {os.path.join(settings.root, 'index.html')}")
    failed = rows[-1] if rows and "exit_code" in rows[-1] else None
    if failed is not None:
        reason = failed["error"] or f"luigi exited {failed['exit_code']}"
        print(
            error_line(f"night {failed['date']} failed: {reason} (log {failed['log']})"),
            file=sys.stderr,
        )
        return EXIT_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
