"""A stage's settings written once: the fields of its config dataclass carry their own help.

Each field of a stage's config (TrainConfig, PreprocessConfig, EvaluateConfig) is declared
with `dataclasses.field(default=..., metadata={"help": "...", "choices": (...)})`. The stage's
command line (`add_flags`) and the pipeline's Luigi parameters (pipeline.stage_params) are
both built from those fields, so a new setting needs no other declaration: its name, type,
default, choices and description come from the dataclass (and docs/configuration.md from
those, by `make docs`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from collections.abc import Callable, Collection, Iterator
from typing import Any

HELP = "help"  # metadata key: one or two sentences for --help, the Luigi description and docs
CHOICES = "choices"  # metadata key: the values a str setting accepts


class SettingsError(ValueError):
    """A stage setting is out of range, unknown or does not go with another: one line naming
    it and what it must be. Every stage's config raises it (or its own subclass); a stage's
    command line turns it into its `error: ...` line and exit 2, a Luigi task into a refusal
    before anything is scheduled."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """One field of a stage's config, as the command line and the pipeline see it.

    Attributes:
        name: the field's name (`per_worker_batch_size`; the flag is `--per-worker-batch-size`).
        kind: the value's type: bool, int, float, str, dict or list.
        optional: None is a value too (the field's type is `X | None`).
        default: the field's default; dataclasses.MISSING where the setting is required.
        help: what the setting does, from the field's metadata.
        choices: the values a str setting accepts, or None for any.
    """

    name: str
    kind: type
    optional: bool
    default: Any
    help: str
    choices: tuple[str, ...] | None

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING

    @property
    def flag(self) -> str:
        return f"--{self.name.replace('_', '-')}"


KINDS = (bool, int, float, str, dict, list)


def settings_of(config_class: type) -> Iterator[Setting]:
    """The settings of a config dataclass, in field order.

    A field without help in its metadata gets an empty one (tests/test_settings.py fails on
    it, and docs/configuration.md shows it).

    Raises:
        TypeError: a field's type is one no flag can carry.
    """
    hints = typing.get_type_hints(config_class)
    for field in dataclasses.fields(config_class):
        where = f"{config_class.__name__}.{field.name}"
        help_text = field.metadata.get(HELP, "")
        kind, optional = _kind(hints[field.name], where)
        if field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = field.default
        choices = field.metadata.get(CHOICES)
        yield Setting(
            field.name,
            kind,
            optional,
            default,
            help_text,
            tuple(choices) if choices is not None else None,
        )


def _kind(hint: Any, where: str) -> tuple[type, bool]:
    """(bool/int/float/str/dict/list, whether None is allowed) of a field's type hint."""
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = [m for m in typing.get_args(hint) if m is not type(None)]
        optional = len(members) < len(typing.get_args(hint))
        if len(members) != 1:
            raise TypeError(f"{where}: a setting has one type (or that type | None), got {hint}")
        hint = members[0]
    kind = typing.get_origin(hint) or hint
    if kind is tuple:
        kind = list
    if kind not in KINDS:
        raise TypeError(f"{where}: settings are bool, int, float, str, dict or list, got {hint}")
    return kind, optional


def parse_bool(text: str) -> bool:
    """'true'/'false' (any case; also 1/0, yes/no) as a bool, as luigi.cfg writes them."""
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parse_json(kind: type) -> Callable[[str], Any]:
    what = "a JSON object" if kind is dict else "a JSON array"

    def parse(text: str) -> Any:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}: {e}") from None
        if not isinstance(value, kind):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


def flag_value_parser(setting: Setting) -> Callable[[str], Any]:
    """How the command line turns a flag's text into the setting's value."""
    if setting.kind is bool:
        return parse_bool
    if setting.kind in (dict, list):
        return _parse_json(setting.kind)
    return setting.kind


def format_flag_value(value: Any) -> str:
    """A value as its flag's text (the inverse of `flag_value_parser`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # every digit: the stage gets the very number
    if isinstance(value, typing.Mapping):
        return json.dumps(plain(value), sort_keys=True)
    if isinstance(value, list | tuple):
        return json.dumps(plain(value))
    return str(value)


def plain(value: Any) -> Any:
    """Luigi's frozen dicts and tuples as JSON's dicts and lists."""
    if isinstance(value, typing.Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def add_flags(
    parser: argparse.ArgumentParser,
    config_class: type,
    underscores: bool = False,
    defaults: dict[str, Any] | None = None,
) -> None:
    """Declares one flag per setting of `config_class`, with its help, type and choices.

    Args:
        underscores: also accept `--per_worker_batch_size` (Beam's spelling) beside
            `--per-worker-batch-size`.
        defaults: a command-line default for a setting the dataclass requires (a date: today).

    A bool flag alone means true: `--overwrite`, `--overwrite true`, `--overwrite false`.
    """
    for setting in settings_of(config_class):
        default = (defaults or {}).get(setting.name, setting.default)
        required = default is dataclasses.MISSING
        help_text = setting.help
        if not required:
            help_text += f" (default: {format_flag_value(default)})"
        names = [setting.flag]
        if underscores and "_" in setting.name:
            names.insert(0, f"--{setting.name}")
        extra: dict[str, Any] = {"nargs": "?", "const": True} if setting.kind is bool else {}
        parser.add_argument(
            *names,
            dest=setting.name,
            type=flag_value_parser(setting),
            choices=setting.choices,
            required=required,
            default=None if required else default,
            help=help_text.replace("%", "%%"),
            **extra,
        )


def from_flags(config_class: type, args: argparse.Namespace) -> Any:
    """The config of parsed flags (`add_flags`)."""
    return config_class(**{f.name: getattr(args, f.name) for f in dataclasses.fields(config_class)})


def flags(config: Any, names: Collection[str] | None = None) -> list[str]:
    """The flags that give a stage `config` (a config dataclass instance), read back by the
    parser `add_flags` makes; None is left out.

    Args:
        names: the settings to write (default: every field), in the config's field order.
    """
    args: list[str] = []
    for field in dataclasses.fields(config):
        if names is not None and field.name not in names:
            continue
        value = getattr(config, field.name)
        if value is not None:
            args += [f"--{field.name.replace('_', '-')}", format_flag_value(value)]
    return args
