"""Luigi tasks of the nightly pipeline: `luigi --module pipeline FullRun --local-scheduler`."""

from pipeline import config_file
from pipeline.data_gate_task import DataGate as DataGate
from pipeline.evaluate_task import Evaluate as Evaluate
from pipeline.full_run import FullRun as FullRun
from pipeline.preprocess_task import Preprocess as Preprocess
from pipeline.train_task import Train as Train

# Before luigi reads any setting (it reads them when it builds the tasks): the project's
# luigi.cfg from any folder, and exit codes for a failed night.
config_file.load()
