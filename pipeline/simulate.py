"""`python -m pipeline.simulate`: consecutive nights with faults injected, every night checked.

    python -m pipeline.simulate --nights 60                 # the default faults, spread out
    python -m pipeline.simulate --nights 7 --faults 1:kill-train,2:kill-evaluate,2:rollback,...

Cuts Fashion-MNIST into small daily drops (`preprocess.make_drops`), starts a webhook and an
SMTP server on loopback, writes a luigi.cfg naming them (and the recipe, thresholds, [Retention]
and [retcode]), then runs each date as cron does, `python -m pipeline FullRun --local-scheduler
--date D` with LUIGI_CONFIG_PATH, injecting the planned faults. After every night it checks
that the night ended as its fault should leave it, what is served is the blessed model and
scores as its metrics.json says, the disk is within [Retention]'s bound, the ledger has one
record per attempt, exactly the expected alerts arrived, and `status` agrees; it prints a
Markdown row a night, the whole table at the end, and writes `<root>/simulation.md`. Exit 0
when every check passed, 1 at the first night with a check that failed (named on stderr), 2
for bad settings. Every night's stages fork from one warm fork server (contract.forkserver),
so TensorFlow and Beam are imported once, not in each stage of each night. The output root
lives on a tmpfs when the machine lets it mount one (as root),
and is copied to `<root>/runs` at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator

from contract import spawn
from contract.forkserver import ENV as FORKSERVER_ENV
from contract.messages import EXIT_BAD_INPUT, EXIT_FAILED, StageArgumentParser, error_line
from pipeline.config_file import PROJECT_ROOT
from pipeline.simulation import commands, config, disk, drops, faults, report
from pipeline.simulation.inspector import Inspector
from pipeline.simulation.nights import Row, Simulation
from pipeline.simulation.servers import Receivers

SETTINGS_FILE = "simulation.json"
DEFAULT_ROOT = "runs-simulation"
SOURCE_DIR = os.path.join(PROJECT_ROOT, ".cache", "fashion-mnist")


class SimulationError(Exception):
    """A setting or a root the simulation cannot run with."""


def parse_args(argv: list[str]) -> tuple[config.Settings, str]:
    """The settings the command line asks for, and Fashion-MNIST's folder.

    Raises:
        SimulationError: a value out of range, or a fault plan that cannot be run.
    """
    parser = StageArgumentParser(
        prog="python -m pipeline.simulate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nights", type=int, default=60, help="consecutive dates to run")
    parser.add_argument("--root", default=DEFAULT_ROOT, help="a new folder for everything")
    parser.add_argument("--start", help="the first night (default: the last night is yesterday)")
    parser.add_argument(
        "--faults",
        help="NIGHT:FAULT,... or 'none' (default: each fault once, spread over the nights); "
        f"faults: {', '.join(faults.FAULTS)}",
    )
    parser.add_argument("--per-day", type=int, help="images a drop (default 400 or fewer)")
    parser.add_argument("--window-days", type=int, default=3, help="the rolling window")
    parser.add_argument("--test-examples", type=int, default=500, help="the fixed eval set")
    parser.add_argument("--epochs", type=int, default=2, help="Train epochs a night")
    parser.add_argument("--seed", type=int, default=0, help="seeds the deal into drops")
    parser.add_argument("--disk-mb", type=int, default=2048, help="the output root's tmpfs")
    parser.add_argument(
        "--no-tmpfs",
        action="store_true",
        help="no tmpfs even as root: the output root on the disk, a full disk a file-size limit",
    )
    parser.add_argument(
        "--own-processes",
        action="store_true",
        help="no fork server: every stage of every night imports TensorFlow in its own process",
    )
    parser.add_argument("--source-dir", default=SOURCE_DIR, help="Fashion-MNIST's IDX files")
    args = parser.parse_args(argv)
    for name in ("nights", "window_days", "test_examples", "epochs", "disk_mb"):
        if getattr(args, name) < 1:
            raise SimulationError(f"--{name.replace('_', '-')} must be at least 1")
    try:
        plan = (
            faults.default_plan(args.nights)
            if args.faults is None
            else faults.parse(args.faults, args.nights)
        )
        start = args.start or config.default_start(args.nights)
        last = datetime.date.fromisoformat(start) + datetime.timedelta(days=args.nights - 1)
    except (faults.FaultPlanError, ValueError) as e:
        raise SimulationError(str(e)) from None
    if last >= datetime.datetime.now(datetime.UTC).date():
        raise SimulationError(
            f"the last night would be {last}, not before today (UTC): a rollback refuses a date "
            "to come; pass an earlier --start"
        )
    settings = config.Settings(
        root=os.path.abspath(args.root),
        nights=args.nights,
        start=start,
        plan=plan,
        per_day=args.per_day or config.default_per_day(args.nights),
        test_examples=args.test_examples,
        window_days=args.window_days,
        epochs=args.epochs,
        seed=args.seed,
        disk_mb=args.disk_mb,
        tmpfs=not args.no_tmpfs,
        fork_server=not args.own_processes,
    )
    return settings, args.source_dir


def claim_root(settings: config.Settings) -> None:
    """Makes the root: a new folder, or an earlier simulation's, replaced.

    Raises:
        SimulationError: the folder holds something else, or a tmpfs is still mounted in it.
    """
    root = settings.root
    if os.path.exists(root) and os.listdir(root):
        if not os.path.exists(os.path.join(root, SETTINGS_FILE)):
            raise SimulationError(f"--root {root} exists and is not a simulation's: pass another")
        if os.path.ismount(settings.disk):
            raise SimulationError(f"{settings.disk} is still mounted: `umount {settings.disk}`")
        shutil.rmtree(root)
    os.makedirs(settings.logs)
    with open(os.path.join(root, SETTINGS_FILE), "w") as f:
        json.dump({"nights": settings.nights, "start": settings.start,
                   "faults": faults.describe(settings.plan)}, f, indent=2)  # fmt: skip


def run(settings: config.Settings, source_dir: str) -> tuple[list[Row], str, float]:
    """Runs every night, printing a row each, until one fails a check.

    Returns:
        The rows, how the disk was set up, and the wall time in seconds.
    """
    started = time.monotonic()
    rows: list[Row] = []
    with Receivers() as receivers, _fork_server(settings.fork_server):
        config.write_luigi_config(settings, receivers.webhook.url, receivers.mailbox.port)
        print(f"cutting {settings.nights} daily drops of {settings.per_day} images", flush=True)
        drops.cut(settings, source_dir)
        output_disk = disk.prepare(settings.disk, settings.disk_mb, settings.tmpfs)
        print(f"disk: {output_disk.note}; faults: {faults.describe(settings.plan)}", flush=True)
        inspector = Inspector(
            os.path.join(settings.logs, "inspector.log"), commands.environment(settings)
        )
        try:
            simulation = Simulation(settings, output_disk, receivers, inspector)
            print(report.HEADER, flush=True)
            for number, date in enumerate(settings.dates(), start=1):
                try:
                    rows.append(simulation.night(number, date))
                except (TimeoutError, RuntimeError, OSError) as e:
                    here = settings.plan.get(number, ())
                    rows.append(Row.broken(number, date, here, f"{type(e).__name__}: {e}"))
                print(report.row_line(rows[-1]), flush=True)
                if rows[-1].failed:
                    break
        finally:
            inspector.close()
            kept = output_disk.release(os.path.join(settings.root, "runs"))
    print(f"output root: {kept}", flush=True)
    return rows, output_disk.note, time.monotonic() - started


@contextlib.contextmanager
def _fork_server(wanted: bool) -> Iterator[None]:
    """Every night's stages fork from one warm fork server (contract.spawn), which imports
    TensorFlow and Beam once for all nights; one already named in the environment is used.
    Not `wanted`: none, even one named in the environment."""
    os.environ.update(commands.IMPORT_TIME_ENV)
    if not wanted or os.environ.get(FORKSERVER_ENV):
        named = None if wanted else os.environ.pop(FORKSERVER_ENV, None)
        try:
            yield
        finally:
            if named is not None:
                os.environ[FORKSERVER_ENV] = named
        return
    with spawn.serving_this_process():
        yield


def main(argv: list[str] | None = None) -> int:
    """Command line: 0 when every check passed, 1 when one failed, 2 for bad settings."""
    try:
        settings, source_dir = parse_args(sys.argv[1:] if argv is None else argv)
        claim_root(settings)
        rows, disk_note, seconds = run(settings, source_dir)
    except (SimulationError, drops.DropError) as e:
        print(error_line(str(e)), file=sys.stderr)
        return EXIT_BAD_INPUT
    path = report.write(settings, rows, disk_note, seconds)
    print(f"\n{report.table(rows)}\n\n{path}; wall time {seconds:.0f} s on {report.machine()}")
    failed = report.failures(rows)
    for line in failed:
        print(error_line(line), file=sys.stderr)
    return EXIT_FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main())
