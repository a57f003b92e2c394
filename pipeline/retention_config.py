"""The `[Retention]` section of luigi.cfg: how long each kind of output is kept."""

from __future__ import annotations

import dataclasses
import warnings

import luigi
import luigi.configuration

SECTION = "Retention"
WHERE = "in luigi.cfg's [Retention] (or --Retention-... on the command line)"


class Retention(luigi.Config):
    """[Retention]: what `python -m pipeline gc`, and every FullRun as it ends, removes."""

    keep_shard_sets = luigi.IntParameter(
        default=7,
        description="Shard sets (<date>/data/) kept: those of the newest N evaluated nights; "
        "an older evaluated night's is removed. A night's shard set is made from its window "
        "of sources, never from an earlier shard set, and the data gate compares with the "
        "newest earlier night whose gate passed, so a few are enough. 0: keep all.",
    )
    keep_checkpoints = luigi.BoolParameter(
        default=False,
        description="Keep an evaluated night's <date>/train/checkpoint/ and backup/; false "
        "removes them once its evaluate/metrics.json exists (model.keras, history.json, "
        "config.json, tensorboard/ and logs stay).",
    )
    keep_blessed_models = luigi.IntParameter(
        default=0,
        description="Blessed nights' models (<date>/train/model.keras) kept: the newest N "
        "blessed nights'; 0: keep all. A rollback needs the night's model.",
    )
    not_blessed_model_days = luigi.IntParameter(
        default=14,
        description="Days a night that was not blessed keeps its model.keras (it can never be "
        "served); counted from the night's date. 0: keep it.",
    )
    keep_served_versions = luigi.IntParameter(
        default=10,
        description="Versions kept in the served folder (<export_base>/<model_name>/): the "
        "newest N, and always the one latest.json names; 0: keep all. A rollback needs the "
        "night's version, served or in quarantine.",
    )
    quarantine_days = luigi.IntParameter(
        default=30,
        description="Days a quarantined version (<export_base>/<model_name>.quarantine/) is "
        "kept after it was quarantined; 0: keep it.",
    )
    superseded_days = luigi.IntParameter(
        default=30,
        description="Days a <date>/superseded/<timestamp>/ folder left by --force-stage is "
        "kept after it was moved aside; 0: keep it.",
    )


class RetentionSettingsError(ValueError):
    """A [Retention] setting cannot be used; the message names it and how to fix it."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """The [Retention] values, read once (fields as Retention's parameters)."""

    keep_shard_sets: int
    keep_checkpoints: bool
    keep_blessed_models: int
    not_blessed_model_days: int
    keep_served_versions: int
    quarantine_days: int
    superseded_days: int

    def check(self) -> None:
        """Refuses a negative count or number of days.

        Raises:
            RetentionSettingsError: naming the setting, its value and what to give instead.
        """
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, bool) and value < 0:
                raise RetentionSettingsError(
                    f"[Retention] {field.name} is {value}: give 0 (keep all) or more {WHERE}"
                )


def parameter_names() -> list[str]:
    return [name for name, _ in Retention.get_params()]


def default_settings() -> Settings:
    """The settings as Retention's parameters declare their defaults."""
    return Settings(**{name: parameter._default for name, parameter in Retention.get_params()})


def check_keys() -> None:
    """Refuses a key of luigi.cfg's [Retention] that is not a setting (luigi ignores them).

    Raises:
        RetentionSettingsError: naming the key and the settings there are.
    """
    config = luigi.configuration.get_config()
    if not hasattr(config, "has_section") or not config.has_section(SECTION):
        return
    known = set(parameter_names())
    defaults = set(config.defaults())
    for key in config.options(SECTION):
        if key not in defaults and key.replace("-", "_") not in known:
            raise RetentionSettingsError(
                f"luigi.cfg's [Retention] has an unknown key {key!r}: the settings are "
                f"{', '.join(sorted(known))}; fix its name or remove it"
            )


def current_settings() -> Settings:
    """[Retention] as luigi reads it now (inside a luigi run, the command line's values too).

    Raises:
        RetentionSettingsError: a value luigi cannot parse (`keep_shard_sets = seven`).
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # luigi's about dashed key names
            config = Retention()
    except ValueError as e:
        raise RetentionSettingsError(f"[Retention]: {e}; fix it {WHERE}") from None
    return Settings(**{name: getattr(config, name) for name in parameter_names()})


def checked_settings() -> Settings:
    """The current settings, their keys and values checked.

    Raises:
        RetentionSettingsError: an unknown key, a value that is not a number, a negative one.
    """
    check_keys()
    settings = current_settings()
    settings.check()
    return settings
