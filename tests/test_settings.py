"""One declaration per setting: a config dataclass's fields give the stage's flags and the
Luigi task's parameters (name, type, choices, description, default)."""

from __future__ import annotations

import argparse
import dataclasses
import datetime

import luigi
import pytest

from contract import layout, settings
from evaluate.config import EvaluateConfig
from pipeline.data_gate_task import DataGate
from pipeline.evaluate_task import Evaluate
from pipeline.preprocess_task import Preprocess
from pipeline.stage_params import stage_config, stage_parameters
from pipeline.train_task import Train
from preprocess.config import PreprocessConfig
from preprocess.data_gate import DataGateConfig
from train.config import WARM_START_SETTLED, ConfigError, TrainConfig
from train.launcher import worker_argv


@dataclasses.dataclass(frozen=True)
class ExampleConfig:
    """Every kind of setting a stage may declare."""

    data_dir: str = dataclasses.field(metadata={"help": "Where the data is."})
    width: int = dataclasses.field(default=3, metadata={"help": "Units."})
    rate: float = dataclasses.field(default=0.5, metadata={"help": "A rate."})
    mode: str = dataclasses.field(default="a", metadata={"help": "A mode.", "choices": ("a", "b")})
    note: str = dataclasses.field(default="", metadata={"help": "Free text."})
    warm: bool = dataclasses.field(default=False, metadata={"help": "Warm start."})
    hparams: dict = dataclasses.field(default_factory=dict, metadata={"help": "Free options."})
    limit: float | None = dataclasses.field(default=None, metadata={"help": "A cap, or none."})


@stage_parameters(ExampleConfig, skip=("data_dir",))
class ExampleTask(luigi.Task):
    """A task whose parameters come from ExampleConfig."""


def parse(config_class: type, args: list[str]):
    parser = argparse.ArgumentParser()
    settings.add_flags(parser, config_class)
    return settings.from_flags(config_class, parser.parse_args(args))


def test_parameter_types_follow_the_field_types():
    params = dict(ExampleTask.get_params())
    assert "data_dir" not in params
    kinds = {name: type(p) for name, p in params.items()}
    assert kinds == {
        "width": luigi.IntParameter,
        "rate": luigi.FloatParameter,
        "mode": luigi.ChoiceParameter,
        "note": luigi.Parameter,
        "warm": luigi.BoolParameter,
        "hparams": luigi.DictParameter,
        "limit": luigi.OptionalFloatParameter,
    }
    assert params["mode"]._choices == {"a", "b"}
    assert params["width"].description == "Units." and params["width"]._default == 3


def test_task_values_reach_the_stage_as_the_same_config():
    task = ExampleTask(
        width=7, rate=0.1, mode="b", note="x y", warm=True, hparams={"depth": [1, 2], "w": 64.0}
    )
    config = parse(ExampleConfig, settings.flags(stage_config(task, ExampleConfig, data_dir="d")))
    assert config == ExampleConfig(
        "d", 7, 0.1, "b", "x y", True, {"depth": [1, 2], "w": 64.0}, None
    )


def test_flags_round_trip_a_config():
    config = ExampleConfig("d", 1, 1e-7, "b", "", True, {"k": {"n": 1}}, 0.25)
    assert parse(ExampleConfig, settings.flags(config)) == config


STAGES = [
    (Train, TrainConfig, ("output_root", "date", "data_dir", "train_dir", *WARM_START_SETTLED)),
    (Evaluate, EvaluateConfig, ("output_root", "date", "dataset")),
    (Preprocess, PreprocessConfig, ("output_root", "date", "dataset", "num_workers", "overwrite")),
    (DataGate, DataGateConfig, ("output_root", "date")),
]


@pytest.mark.parametrize(
    "config_class", [TrainConfig, EvaluateConfig, PreprocessConfig, DataGateConfig]
)
def test_every_stage_setting_is_described(config_class):
    undescribed = [s.name for s in settings.settings_of(config_class) if not s.help.strip()]
    assert not undescribed, 'describe these fields (metadata={"help": ...})'


def test_the_tasks_values_make_the_stages_config():
    task = ExampleTask(hparams={"depth": [1, 2]}, limit=0.5)
    config = stage_config(task, ExampleConfig, data_dir="d")
    assert config == ExampleConfig("d", hparams={"depth": [1, 2]}, limit=0.5)
    assert type(config.hparams) is dict and type(config.hparams["depth"]) is list


def test_the_stage_refuses_a_choice_it_does_not_know():
    with pytest.raises(SystemExit):
        parse(ExampleConfig, ["--data-dir", "d", "--mode", "c"])


@pytest.mark.parametrize(("task", "config_class", "own"), STAGES)
def test_task_declares_each_stage_setting_as_the_stage_does(task, config_class, own):
    params = dict(task.get_params())
    for setting in settings.settings_of(config_class):
        if setting.name in own:  # the run's folders and shared values: the task sets them
            continue
        param = params[setting.name]
        assert param._default == setting.default, setting.name
        assert param.description.replace("%%", "%").startswith(setting.help), setting.name
        assert getattr(param, "_choices", set()) == set(setting.choices or ()), setting.name


def test_train_task_command_gives_the_stage_the_tasks_values(tmp_path):
    task = Train(date=datetime.date(2026, 1, 31), output_root=str(tmp_path), epochs=3, seed=9)
    parser = argparse.ArgumentParser()
    settings.add_flags(parser, TrainConfig)
    parser.add_argument("--num-workers", type=int)
    parser.add_argument("--max-restarts", type=int)
    config = settings.from_flags(TrainConfig, parser.parse_args(task.command()[4:]))
    assert (config.epochs, config.seed) == (3, 9)
    assert config.precision == task.precision and config.model == task.model


def test_train_task_gives_the_stage_its_run_not_only_the_runs_folders(tmp_path):
    task = Train(date=datetime.date(2026, 1, 31), output_root=str(tmp_path))
    config = task.stage_config
    assert (config.output_root, config.date) == (str(tmp_path), "2026-01-31")
    assert config.train_dir == layout.train_dir(str(tmp_path), "2026-01-31")
    assert config.data_dir == layout.data_dir(str(tmp_path), "2026-01-31")


@pytest.mark.parametrize(
    ("run", "message"),
    [
        ({"output_root": "runs"}, "output_root is given without date"),
        ({"date": "2026-01-31"}, "date is given without output_root"),
        ({"output_root": "runs", "date": "2026-02-30"}, "date must be a calendar date"),
    ],
)
def test_a_train_run_is_its_root_and_date_together(run, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig("d", "t", **run).check()


def test_evaluate_task_command_gives_the_stage_the_tasks_values(tmp_path):
    from evaluate.__main__ import parse_args

    task = Evaluate(date=datetime.date(2026, 1, 31), output_root=str(tmp_path), batch_size=7)
    config = parse_args(task.command()[3:])
    assert config == stage_config(
        task, EvaluateConfig, output_root=str(tmp_path), date="2026-01-31", dataset=task.dataset
    )
    assert config.batch_size == 7


def test_worker_command_carries_the_launchers_config():
    config = TrainConfig("d", "t", epochs=2, learning_rate=0.1 + 0.2, augment="flip-shift")
    assert parse(TrainConfig, worker_argv(config)[4:]) == config


def test_every_training_setting_declares_whether_it_shapes_training():
    from train import backup
    from train.config import SHAPING_SETTINGS

    for field in dataclasses.fields(TrainConfig):
        assert isinstance(field.metadata.get("shapes_training"), bool), field.name
    # What the resume fingerprint and FullRun's "settings changed" check use comes from it.
    assert set(backup.FINGERPRINTED_SETTINGS) < set(SHAPING_SETTINGS)
    assert set(SHAPING_SETTINGS) - set(backup.FINGERPRINTED_SETTINGS) == {
        "hparams",
        "input_memory_budget_mb",
    }
    for name in ("save_freq_steps", "collective_timeout_seconds", "allow_host_network"):
        assert name not in SHAPING_SETTINGS
    assert set(WARM_START_SETTLED) < set(backup.FINGERPRINTED_SETTINGS)
