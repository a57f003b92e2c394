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
from pipeline.stage_params import stage_config, stage_flags, stage_parameters
from pipeline.targets import GFileTarget
from preprocess.errors import BadInputError
from preprocess.gate_config import DataGateConfig

STAGE_LOG_FILE = "data_gate.log"


@stage_parameters(DataGateConfig, skip=("output_root", "date"))  # the run's own
class DataGate(RunTask):
    """Checks the run's data statistics against the kept schema and the previous night's.

    Every setting of preprocess.gate_config.DataGateConfig but the run's own is a parameter here
    too (same name, type, description and default); luigi.cfg's [DataGate] gives the values
    that differ.
    """

    def check_parameters(self) -> None:
        # The gate's own checks (thresholds finite and at least 0) on this task's values.
        gate = stage_config(self, DataGateConfig, output_root=self.output_root, date=self.date_str)
        try:
            gate.check()
        except BadInputError as e:
            raise ValueError(str(e)) from None

    def requires(self) -> luigi.Task:
        return Preprocess(**self.shared_params())

    def output(self) -> GFileTarget:
        return GFileTarget(
            layout.join(layout.data_dir(self.output_root, self.date_str), manifest.DATA_GATE_FILE)
        )

    def command(self) -> list[str]:
        """The gate's command line; with `[Executor] kind = docker` it runs in a container."""
        args = [sys.executable, "-m", "preprocess.data_gate", f"--output_root={self.output_root}"]
        return args + [f"--date={self.date_str}", *stage_flags(self)]

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
    schema = verdict["schema"]
    reset = bool(verdict.get("reset_schema"))
    if verdict.get("baseline_date") is None:
        if not schema["inferred_now"] or reset:
            against = "with no earlier night to compare"
        elif schema.get("kept_now", True):
            against = "on its first night (schema inferred)"
        else:
            against = "on its first night (schema not kept: the night did not pass)"
    else:
        # The training data's measures first, then the eval split's (`eval_...`).
        ordered = sorted(verdict["measures"].items(), key=lambda m: (m[0].startswith("eval_"), m))
        measures = ", ".join(f"{k} {v:.4f}" for k, v in ordered)
        against = f"against {verdict['baseline_date']} ({measures})"
    accepted = f", {verdict['anomalies']} anomalies accepted" if verdict["anomalies"] else ""
    again = ", schema inferred again (--DataGate-reset-schema)" if reset else ""
    return f"{verdict['status']} {against}{accepted}{again}"
