"""Luigi parameters built from a stage's config dataclass (contract.settings), not copied.

`@stage_parameters(TrainConfig, ...)` gives a task one parameter per setting of the stage:
the same name, type (int -> IntParameter, float -> FloatParameter, str with choices ->
ChoiceParameter, bool -> BoolParameter, dict -> DictParameter, ...), choices, description and
default. luigi.cfg's section of the task then holds the values that differ.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

import luigi
from luigi.parameter import ConfigPath

from contract import settings
from contract.settings import Setting

TaskClass = TypeVar("TaskClass", bound=type[luigi.Task])

STAGE_SETTINGS = "stage_settings"  # class attribute: the names of the derived parameters

_PLAIN: dict[type, Any] = {
    bool: luigi.BoolParameter,
    int: luigi.IntParameter,
    float: luigi.FloatParameter,
    str: luigi.Parameter,
    dict: luigi.DictParameter,
    list: luigi.ListParameter,
}
_OPTIONAL: dict[type, Any] = {
    bool: luigi.OptionalBoolParameter,
    int: luigi.OptionalIntParameter,
    float: luigi.OptionalFloatParameter,
    str: luigi.OptionalParameter,
    dict: luigi.OptionalDictParameter,
    list: luigi.OptionalListParameter,
}


def parameter_for(setting: Setting, fallback: ConfigPath | None = None) -> luigi.Parameter[Any]:
    """The Luigi parameter of one stage setting; `fallback` is where luigi.cfg may give it
    when the task's own section does not (luigi's `config_path`)."""
    # luigi hands the description to argparse, which formats help with %: '90%' must be '90%%'.
    kwargs: dict[str, Any] = {"description": setting.help.replace("%", "%%")}
    if not setting.required:
        kwargs["default"] = setting.default
    if fallback is not None:
        kwargs["config_path"] = fallback
        kwargs["description"] += f" Falls back to [{fallback['section']}] {fallback['name']}."
    if setting.choices is not None:
        kind = luigi.OptionalChoiceParameter if setting.optional else luigi.ChoiceParameter
        return kind(choices=setting.choices, var_type=str, **kwargs)
    return (_OPTIONAL if setting.optional else _PLAIN)[setting.kind](**kwargs)


def stage_parameters(
    config_class: type,
    skip: Collection[str] = (),
    fallbacks: Mapping[str, ConfigPath] | None = None,
) -> Callable[[TaskClass], TaskClass]:
    """A class decorator giving a task one parameter per setting of `config_class`.

    Args:
        config_class: the stage's config dataclass (its fields carry contract.settings help).
        skip: settings the task sets itself (paths it derives from the run's date, say).
        fallbacks: per setting, the luigi.cfg option read when the task's section lacks it.

    A parameter the task declares in its own body is left as it is.
    """

    def decorate(task: TaskClass) -> TaskClass:
        names = []
        for setting in settings.settings_of(config_class):
            if setting.name in skip:
                continue
            names.append(setting.name)
            if isinstance(getattr(task, setting.name, None), luigi.Parameter):
                continue
            fallback = (fallbacks or {}).get(setting.name)
            parameter = parameter_for(setting, fallback)
            setattr(task, setting.name, parameter)
            parameter.__set_name__(task, setting.name)  # what a class body's assignment does
        setattr(task, STAGE_SETTINGS, tuple(names))
        return task

    return decorate


def stage_config(task: luigi.Task, config_class: type, **others: Any) -> Any:
    """The stage's config of the task's values (Luigi's frozen dicts as plain ones) and
    `others`, the settings the task derives itself (`skip`); the config's own checks apply."""
    values = {name: settings.plain(getattr(task, name)) for name in getattr(task, STAGE_SETTINGS)}
    return config_class(**values, **others)
