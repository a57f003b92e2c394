"""Luigi task of the data gate: maps its parameters onto `python -m preprocess.data_gate`.

It sits between Preprocess and Train (Train requires it), so a night whose data the gate finds
anomalous stops before training, with the gate's one-line reason and `<run>/data/anomalies.json`.
Its files live in the shard set's folder, so `--force-stage preprocess` reruns it too.
"""

from __future__ import annotations

import sys

import luigi

from contract import atomic, layout, manifest
from pipeline import config, runner
from pipeline.params import RunTask
from pipeline.preprocess_task import Preprocess
from pipeline.targets import GFileTarget

STAGE_LOG_FILE = "data_gate.log"


class DataGate(RunTask):
    """Checks the run's data statistics against the kept schema and the previous night's."""

    label_drift_threshold = luigi.FloatParameter(
        default=0.1,
        description="Largest L-infinity distance between the label distribution of the night's "
        "training data and the previous passed night's (0.1: no class's share moves by more "
        "than 10 points).",
    )
    pixel_mean_shift_threshold = luigi.FloatParameter(
        default=0.1,
        description="Largest change of the mean pixel value from the previous passed night, in "
        "units of that night's pixel standard deviation.",
    )
    pixel_stddev_shift_threshold = luigi.FloatParameter(
        default=0.1,
        description="Largest change of the pixel standard deviation from the previous passed "
        "night, relative to it.",
    )
    accept_anomalies = luigi.BoolParameter(
        default=False,
        description="Let the night's data through whatever the gate finds (the anomalies are "
        "still written and the verdict says 'accepted'). Per invocation: "
        "--DataGate-accept-anomalies; never set it in luigi.cfg.",
    )

    def requires(self) -> luigi.Task:
        return Preprocess(**self.shared_params())

    def output(self) -> GFileTarget:
        return GFileTarget(
            layout.join(layout.data_dir(self.output_root, self.date_str), manifest.DATA_GATE_FILE)
        )

    def command(self) -> list[str]:
        """The gate's command line; with `[Executor] kind = docker` it runs in a container."""
        args = [
            sys.executable,
            "-m",
            "preprocess.data_gate",
            f"--output_root={self.output_root}",
            f"--date={self.date_str}",
            f"--label_drift_threshold={self.label_drift_threshold!r}",
            f"--pixel_mean_shift_threshold={self.pixel_mean_shift_threshold!r}",
            f"--pixel_stddev_shift_threshold={self.pixel_stddev_shift_threshold!r}",
        ]
        return args + (["--accept_anomalies"] if self.accept_anomalies else [])

    def run(self) -> None:
        self.hold_run_lock()
        logs = layout.logs_dir(self.output_root, self.date_str)
        runner.run_stage(
            self,
            "data-gate",
            self.command(),
            layout.join(logs, STAGE_LOG_FILE),
            container=config.container_settings(),
        )
        print(f"[data-gate] {verdict_line(atomic.read_json(self.output().path))}",
              file=sys.stderr, flush=True)  # fmt: skip


def verdict_line(verdict: dict) -> str:
    """`passed against 2026-01-01 (label L-inf 0.0123, pixel mean shift 0.0040, ...)`."""
    if verdict.get("baseline_date") is None:
        against = (
            "on its first night (schema inferred)"
            if verdict["schema"]["inferred_now"]
            else ("with no earlier night to compare")
        )
    else:
        measures = ", ".join(f"{k} {v:.4f}" for k, v in sorted(verdict["measures"].items()))
        against = f"against {verdict['baseline_date']} ({measures})"
    accepted = f", {verdict['anomalies']} anomalies accepted" if verdict["anomalies"] else ""
    return f"{verdict['status']} {against}{accepted}"
