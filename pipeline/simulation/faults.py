"""The faults a simulation injects, and on which nights: `--faults 5:kill-train,9:missed,...`."""

from __future__ import annotations

KILL_TRAIN = "kill-train"
KILL_EVALUATE = "kill-evaluate"
CORRUPT_DROP = "corrupt-drop"
DRIFTED_DROP = "drifted-drop"
WORSE_MODEL = "worse-model"
MISSED = "missed"
ROLLBACK = "rollback"
DISK_FULL = "disk-full"
# In the order the default plan spreads them over the nights.
FAULTS = (
    KILL_TRAIN,
    KILL_EVALUATE,
    ROLLBACK,
    MISSED,
    CORRUPT_DROP,
    DRIFTED_DROP,
    WORSE_MODEL,
    DISK_FULL,
)
DESCRIPTIONS = {
    KILL_TRAIN: "the night's process group SIGKILLed in Train's second epoch (its workers held "
    "at its first step); cron's next attempt of the date must complete it",
    KILL_EVALUATE: "the same while Evaluate runs (its model scored, not yet pushed)",
    CORRUPT_DROP: "the night's drop cut short (a truncated TFRecord): the night must fail "
    "cleanly; the drop is delivered again whole before the next night",
    DRIFTED_DROP: "the night's drop with its images inverted: the data gate must stop it; "
    "delivered again as it should be before the next night",
    WORSE_MODEL: "a bad recipe for one night (a cold start at learning rate 1e-6): the "
    "blessing must reject the model",
    MISSED: "no run of the date: the morning's status and the alerts must report it",
    ROLLBACK: "after the night, `python -m pipeline rollback --to` the last blessed night "
    "before the served one",
    DISK_FULL: "the output root's filesystem full during the night: it must fail cleanly; "
    "once space is freed, the next attempt of the date must complete it",
}
# Faults that stop the night before Train: a night carries at most one fault of its own.
RUN_FAULTS = tuple(f for f in FAULTS if f != ROLLBACK)
# Faults that need a night before them: a baseline to drift from, a night to have missed.
NOT_FIRST = (DRIFTED_DROP, WORSE_MODEL, MISSED, ROLLBACK)
# The nights the compact plan gives each fault: the fewest nights that hold every fault once.
COMPACT_PLAN = {
    1: (KILL_TRAIN,),
    2: (KILL_EVALUATE, ROLLBACK),
    3: (MISSED,),
    4: (CORRUPT_DROP,),
    5: (DRIFTED_DROP,),
    6: (WORSE_MODEL,),
    7: (DISK_FULL,),
}
NO_FAULTS = "none"

Plan = dict[int, tuple[str, ...]]


class FaultPlanError(ValueError):
    """A fault plan that cannot be run; the message names the entry and what to give."""


def parse(text: str, nights: int) -> Plan:
    """The plan `--faults` gives: comma-separated `NIGHT:FAULT` entries, or `none`.

    Args:
        text: e.g. `5:kill-train,9:kill-evaluate,9:rollback`; a night may repeat to carry a
            rollback beside its own fault.
        nights: how many nights the simulation runs (nights are numbered from 1).

    Raises:
        FaultPlanError: an entry that is not NIGHT:FAULT, an unknown fault, a night out of
            range, or a plan `check` refuses.
    """
    plan: dict[int, list[str]] = {}
    if text.strip() == NO_FAULTS:
        return {}
    for entry in (part.strip() for part in text.split(",")):
        night_text, sep, fault = entry.partition(":")
        if not sep or not night_text.strip().isdigit():
            raise FaultPlanError(
                f"--faults entry {entry!r} is not NIGHT:FAULT (e.g. 5:kill-train); give "
                f"comma-separated entries, or '{NO_FAULTS}'"
            )
        night, fault = int(night_text), fault.strip()
        if fault not in FAULTS:
            raise FaultPlanError(
                f"--faults entry {entry!r}: unknown fault {fault!r}; the faults are "
                f"{', '.join(FAULTS)}"
            )
        plan.setdefault(night, []).append(fault)
    checked = {night: tuple(faults) for night, faults in sorted(plan.items())}
    check(checked, nights)
    return checked


def check(plan: Plan, nights: int) -> None:
    """Refuses a plan the simulation cannot run as written.

    Raises:
        FaultPlanError: naming the night and what is wrong with it.
    """
    for night, faults in plan.items():
        where = f"--faults: night {night}"
        if not 1 <= night <= nights:
            raise FaultPlanError(f"{where} is outside the simulation's nights 1-{nights}")
        if len(set(faults)) != len(faults):
            raise FaultPlanError(f"{where} names the same fault twice")
        own = [f for f in faults if f in RUN_FAULTS]
        if len(own) > 1:
            raise FaultPlanError(
                f"{where} has {' and '.join(own)}: a night takes one fault, and a rollback"
            )
        early = [f for f in faults if f in NOT_FIRST]
        if night == 1 and early:
            raise FaultPlanError(f"{where}: {early[0]} needs a night before it")
        if MISSED in faults and night == nights:
            raise FaultPlanError(f"{where}: a missed night needs a night after it")


def default_plan(nights: int) -> Plan:
    """Every fault once: spread evenly over 9 or more nights, the compact plan on 7 or 8.

    Raises:
        FaultPlanError: fewer than 7 nights (then name the faults with --faults).
    """
    if nights < len(COMPACT_PLAN):
        raise FaultPlanError(
            f"the default fault plan needs at least {len(COMPACT_PLAN)} nights, got {nights}: "
            f"pass --faults (e.g. 2:kill-train) or --faults {NO_FAULTS}"
        )
    if nights <= len(FAULTS):
        return dict(COMPACT_PLAN)
    step = nights / (len(FAULTS) + 1)
    return {round((i + 1) * step): (fault,) for i, fault in enumerate(FAULTS)}


def describe(plan: Plan) -> str:
    """`5:kill-train,9:kill-evaluate,...`, as `parse` reads it."""
    if not plan:
        return NO_FAULTS
    return ",".join(f"{night}:{fault}" for night, faults in plan.items() for fault in faults)
