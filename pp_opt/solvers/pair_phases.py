"""Solving a problem that allows overlapped pairs (docs/design.md §3) with CP-SAT.

A model that may pair ops is larger and searches worse than one that may not, yet every
schedule without pairs is one of its schedules. So the solve runs in two phases: the model
without pairs first, for :data:`UNPAIRED_SHARE` of the time left, then the model with pairs,
hinted by the better of that result and the warm start. The result is then never worse
than the solve without pairs would have been in that share of the time.

A backend's bound holds for the problem only where its model holds every pair a schedule
can form (:func:`decides_pairs`, :func:`pp_opt.solvers.pairing.complete`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from pp_opt.ops import has_pair_savings
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule
from pp_opt.solvers.base import BackendResult, SolveOptions
from pp_opt.solvers.pairing import complete

log = logging.getLogger(__name__)

UNPAIRED_SHARE = 0.4
"""Share of the time left that the model without pairs gets before the model with them."""

Warm = tuple[str, Schedule] | None


def pairs_open(problem: Problem) -> bool:
    """Whether a solve may form pairs that save time (``pairs`` and communication)."""
    return problem.pairs and has_pair_savings(problem)


def decides_pairs(solver: str, problem: Problem) -> bool:
    """Whether the backend's bound holds for ``problem`` (see the module)."""
    if not pairs_open(problem):
        return True
    return solver in ("cpsat", "milp", "milp-highs") and complete(problem)


def unpaired_first(
    problem: Problem,
    options: SolveOptions,
    warm: Warm,
    end: float,
    run: Callable[..., BackendResult],
    check: Callable[[BackendResult], Schedule | None],
) -> tuple[SolveOptions, Warm]:
    """The first phase: ``run`` on the problem without pairs until its share of the time
    is over; its ``check``-ed schedule becomes the warm start where it is the better one."""
    deadline = time.perf_counter() + UNPAIRED_SHARE * (end - time.perf_counter())
    found = check(run(problem=problem.replace(pairs=False), options=options, end=deadline))
    if found is None:
        return options, warm
    value = found.objective_value(problem.objective)
    if warm is not None and warm[1].objective_value(problem.objective) <= value:
        return options, warm
    log.info("pairs: the solve without pairs found %.6g, the warm start of the paired model", value)
    return replace(options, warm_start=found), ("unpaired", found)
