"""One Luigi task class for every stage, driven by a small per-stage spec.

A stage task is declared as

    @stage_task(StageSpec(name="evaluate", module=("evaluate",), config_class=EvaluateConfig,
                          output=lambda run: run.metrics_path, log_file="evaluate.log"))
    class Evaluate(StageTask):
        def requires(self): return Train(**self.shared_params())

and gets one parameter per setting of its stage's config (pipeline.stage_params) but the run's
own, which `contract.run.Run` gives. The task builds the stage's config once from its values
and the run (`stage_config`), the config checks itself (one error type, SettingsError), the
one flag encoder (`contract.settings.flags`) writes it for the stage's parser, which reads it
back, and `runner.run_stage` runs the command: the same command line a user types.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable, Collection
from typing import Any, ClassVar, TypeVar

from contract import layout, settings
from contract.run import Run
from pipeline import config, runner, stage_params
from pipeline.params import RunTask
from pipeline.stage_params import STAGE_SETTINGS, stage_parameters
from pipeline.targets import GFileTarget

TaskClass = TypeVar("TaskClass", bound=type["StageTask"])


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """What a stage task runs.

    Attributes:
        name: the stage's name in the terminal and the ledger (`data-gate`).
        module: `python -m` module and subcommand (`("preprocess", "run")`).
        config_class: the stage's config dataclass; its fields become the task's parameters.
        output: the stage's completion marker, written last, for a run.
        log_file: the stage's log, in the run's logs folder.
        run_settings: the config's fields the run gives (contract.run.RUN_SETTINGS), not
            the task's parameters.
        in_container: whether `[Executor] kind = docker` runs the command in a container (the
            train launcher stays local and runs its workers in containers instead).
        skip: settings the task does not take as parameters besides the run's own.
        fallbacks: per setting, the luigi.cfg option read when the task's section lacks it.
    """

    name: str
    module: tuple[str, ...]
    config_class: type
    output: Callable[[Run], str]
    log_file: str
    run_settings: tuple[str, ...] = ("output_root", "date")
    in_container: bool = True
    skip: Collection[str] = ()
    fallbacks: dict[str, Any] = dataclasses.field(default_factory=dict)


def stage_task(spec: StageSpec) -> Callable[[TaskClass], TaskClass]:
    """Declares a StageTask subclass as the task of `spec`'s stage."""

    def declare(task: TaskClass) -> TaskClass:
        task.spec = spec
        skip = (*spec.run_settings, *spec.skip)
        return stage_parameters(spec.config_class, skip=skip, fallbacks=spec.fallbacks)(task)

    return declare


class StageTask(RunTask):
    """A stage run for one night: its parameters, its completion marker, its command."""

    spec: ClassVar[StageSpec]

    @functools.cached_property
    def run_value(self) -> Run:
        """The night's run, checked once (contract.run)."""
        return Run(self.output_root, self.date, self.dataset, self.num_workers)

    @functools.cached_property
    def stage_config(self) -> Any:
        """The stage's config of this task's values and the run, built once.

        Raises:
            SettingsError: a value the stage refuses (the config's own checks).
        """
        run = self.run_value.settings_for(self.spec.run_settings)
        stage = stage_params.stage_config(self, self.spec.config_class, **run)
        check = getattr(stage, "check", None)
        if check is not None:
            check()
        return stage

    def check_parameters(self) -> None:
        """Refuses the values the stage would refuse, before anything is scheduled.

        Raises:
            SettingsError: naming the setting and what it must be.
        """
        self.stage_config  # noqa: B018 - built and checked once; kept for the command
        self.check_own_parameters()

    def check_own_parameters(self) -> None:
        """A task's parameters that are not its stage's settings; none unless a task says."""

    def output(self) -> GFileTarget:
        return GFileTarget(self.spec.output(self.run_value))

    def stage_flags(self) -> list[str]:
        """The stage's settings as its command line carries them (contract.settings.flags)."""
        names = (*self.spec.run_settings, *getattr(self, STAGE_SETTINGS))
        return settings.flags(self.stage_config, names)

    def extra_args(self) -> list[str]:
        """What the command carries besides the stage's settings; none unless a task says."""
        return []

    def command(self) -> list[str]:
        """The stage's command line, as a user would type it."""
        return [sys.executable, "-m", *self.spec.module, *self.stage_flags(), *self.extra_args()]

    def run(self) -> None:
        self.hold_run_lock()
        runner.run_stage(
            self,
            self.spec.name,
            self.command(),
            layout.join(self.run_value.logs_dir, self.spec.log_file),
            container=config.container_settings() if self.spec.in_container else None,
        )
        self.after_stage()

    def after_stage(self) -> None:
        """What the task shows once its stage succeeded; nothing unless a task says."""
