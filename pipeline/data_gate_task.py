"""Luigi task of the data gate: `python -m preprocess.data_gate` for the night's run.

It sits between Preprocess and Train (Train requires it), so a night whose data the gate finds
anomalous stops before training, with the gate's one-line reason and `<run>/data/anomalies.json`.
Its files live in the shard set's folder, so `--force-stage preprocess` reruns it too.
"""

from __future__ import annotations

import sys

import luigi

from contract import atomic, lineage
from contract.settings import SettingsError
from pipeline.preprocess_task import Preprocess
from pipeline.stage_task import StageSpec, StageTask, stage_task
from preprocess.gate_config import DataGateConfig

SPEC = StageSpec(
    name="data-gate",
    module=("preprocess.data_gate",),
    config_class=DataGateConfig,
    output=lambda run: run.data_gate_path,
    log_file="data_gate.log",
)


@stage_task(SPEC)
class DataGate(StageTask):
    """Checks the run's data statistics against the kept schema and the previous night's.

    Every setting of preprocess.gate_config.DataGateConfig but the run's own is a parameter here
    too (same name, type, description and default); luigi.cfg's [DataGate] gives the values
    that differ.
    """

    reset_schema: bool  # a parameter from DataGateConfig, named here for the type checker

    def check_own_parameters(self) -> None:
        # One output root, one lineage: a night of another dataset is refused before any work.
        problem = None if self.reset_schema else lineage.mismatch(self.output_root, self.dataset)
        if problem is not None:
            raise SettingsError(problem)

    def requires(self) -> luigi.Task:
        return Preprocess(**self.shared_params())

    def after_stage(self) -> None:
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
