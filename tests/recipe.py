"""The nightly recipe as luigi.cfg gives it, for tests that train the way the nightly does."""

from __future__ import annotations

import configparser

from tests.factories import PROJECT_ROOT


def luigi_cfg() -> configparser.ConfigParser:
    """The project's luigi.cfg, as written (not luigi's merged configuration)."""
    config = configparser.ConfigParser()
    config.read(PROJECT_ROOT / "luigi.cfg")
    return config


def nightly(section: str = "Train", *names: str) -> dict[str, str]:
    """luigi.cfg's values of a task's section: all, or those of `names` (each must be there)."""
    values = dict(luigi_cfg()[section])
    return {name: values[name] for name in names} if names else values
