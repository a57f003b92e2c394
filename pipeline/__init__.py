"""Luigi tasks of the nightly pipeline: `luigi --module pipeline FullRun --local-scheduler`."""

from pipeline.data_gate_task import DataGate as DataGate
from pipeline.evaluate_task import Evaluate as Evaluate
from pipeline.full_run import FullRun as FullRun
from pipeline.preprocess_task import Preprocess as Preprocess
from pipeline.train_task import Train as Train
