"""Warm starts: the best classic schedule that fits the caps and has the problem's placement."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pp_opt.errors import PPOptError
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule

log = logging.getLogger(__name__)


def same_placement(a: Problem, b: Problem) -> bool:
    """Whether two problems put the same stages on the same devices (a hint must match)."""
    return [s.device for s in a.stages] == [s.device for s in b.stages] and a.m == b.m


def best_baseline(problem: Problem, objective: str | None = None) -> tuple[str, Schedule] | None:
    """The classic schedule with the best ``objective`` among those that fit ``problem``.

    Baselines over the cap, or needing another placement (ZB-V on a ``loop``
    problem, for example), are skipped. None when no baseline fits.
    """
    from pp_opt.baselines import baseline_names, make_baseline

    objective = objective or problem.objective
    best: tuple[str, Schedule] | None = None
    for name in baseline_names():
        try:
            schedule = make_baseline(name, problem)
        except PPOptError as err:
            log.debug("baseline %s skipped: %s", name, err)
            continue
        if not same_placement(schedule.problem, problem):
            continue
        if best is None or schedule.objective_value(objective) < best[1].objective_value(objective):
            best = (name, schedule)
    return best


def best_warm_start(
    problem: Problem, objective: str | None = None, fractions: Sequence[float] = (1.0,)
) -> tuple[str, Schedule] | None:
    """The better of the best baseline and :func:`~.fallback.fallback_schedule` (which
    fits whenever the caps admit any schedule)."""
    from pp_opt.solvers.fallback import fallback_schedule, greedy_schedules
    from pp_opt.validator import validate

    objective = objective or problem.objective
    found = best_baseline(problem, objective)
    candidates: list[tuple[str, Schedule | None]] = []
    try:
        candidates.append(("fallback", fallback_schedule(problem, fractions)))
        candidates += greedy_schedules(problem)
    except PPOptError as err:
        log.info("heuristic warm start failed: %s", err)
    for name, schedule in candidates:
        if schedule is None or validate(schedule):
            continue
        value = schedule.objective_value(objective)
        if found is None or value < found[1].objective_value(objective):
            found = (name, schedule)
    return found
