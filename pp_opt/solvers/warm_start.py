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


def baseline_candidates(problem: Problem) -> list[tuple[str, Schedule]]:
    """Every classic schedule that fits ``problem`` with its placement (each validated).

    Baselines over the cap, or needing another placement (ZB-V on a ``loop``
    problem, for example), are skipped.
    """
    from pp_opt.baselines import baseline_names, baseline_order, make_baseline

    out = []
    for name in baseline_names():
        try:
            scheduled, _ = baseline_order(name, problem)
            if not same_placement(scheduled, problem):
                continue
            out.append((name, make_baseline(name, problem)))
        except PPOptError as err:
            log.debug("baseline %s skipped: %s", name, err)
    return out


def best_baseline(problem: Problem, objective: str | None = None) -> tuple[str, Schedule] | None:
    """The classic schedule with the best ``objective`` among those that fit ``problem``."""
    objective = objective or problem.objective
    found = baseline_candidates(problem)
    return min(found, key=lambda c: c[1].objective_value(objective)) if found else None


def warm_start_candidates(
    problem: Problem, objective: str | None = None, fractions: Sequence[float] = (1.0,)
) -> list[tuple[str, Schedule, bool]]:
    """Warm starts, best ``objective`` first: ``(name, schedule, validated)``.

    The classic schedules (validated), :func:`~.fallback.fallback_schedule` (which fits
    whenever the caps admit any schedule) and the greedy list schedules (not validated
    yet: the caller validates the one it takes), the Zero Bubble paper's cost-aware
    greedy schedules (:mod:`.zb_heuristic`), and with offload allowed, those made
    without the cap given copies in their gaps (:mod:`.offload_warm`).
    """
    from pp_opt.solvers.fallback import fallback_schedule, greedy_schedules
    from pp_opt.solvers.offload_warm import offload_candidates
    from pp_opt.solvers.zb_heuristic import zb_candidates

    objective = objective or problem.objective
    found = [(name, schedule, True) for name, schedule in baseline_candidates(problem)]
    try:
        extra = fallback_schedule(problem, fractions)
        if extra is not None:
            found.append(("fallback", extra, False))
        found += [(name, schedule, False) for name, schedule in greedy_schedules(problem)]
        found += [(name, schedule, False) for name, schedule in zb_candidates(problem)]
        found += [
            (name, schedule, False) for name, schedule in offload_candidates(problem, fractions)
        ]
    except PPOptError as err:
        log.info("heuristic warm start failed: %s", err)
    return sorted(found, key=lambda c: c[1].objective_value(objective))
