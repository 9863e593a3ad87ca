"""The warm start a solve takes: the best validated candidate, or the caller's schedule.

:func:`pp_opt.solve` never returns anything worse than it; with offload the next
candidates go to the backend too (their compute orders are worth re-placing copies for).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from pp_opt.errors import ProblemError
from pp_opt.metrics import compute_metrics
from pp_opt.orders import candidates
from pp_opt.orders.common import same_placement
from pp_opt.problem import Problem
from pp_opt.runtime_rules import in_runtime_order
from pp_opt.schedule import Schedule
from pp_opt.simulator import retime
from pp_opt.solvers.base import SolveOptions
from pp_opt.validator import ValidationError, check_schedule

log = logging.getLogger(__name__)

Warm = tuple[str, Schedule] | None
"""The warm start a solve took: its name and its validated schedule."""


def with_warm_start(
    problem: Problem, options: SolveOptions, warm_start: bool | Schedule, deadline: float
) -> tuple[Warm, SolveOptions]:
    """The warm start (see :func:`chosen_warm_start`), and the options the backends get: with it
    and, with offload, the next candidates as alternatives."""
    alternatives: list[Schedule] = []
    warm = chosen_warm_start(problem, warm_start, options.offload_fractions, deadline, alternatives)
    with_warm = replace(options, warm_start=warm[1] if warm else None,
                        alternatives=tuple(alternatives))  # fmt: skip
    return warm, with_warm


def chosen_warm_start(
    problem: Problem,
    warm_start: bool | Schedule,
    fractions: Sequence[float],
    deadline: float,
    alternatives: list[Schedule] | None = None,
) -> tuple[str, Schedule] | None:
    """The first warm start (best objective first) that the validator passes; with offload,
    the next :data:`ALTERNATIVES` candidates go to ``alternatives`` (their compute orders
    are worth re-placing copies for, :class:`SolveOptions`). A given schedule is re-timed on
    the problem and kept unless a generated one is better."""
    if warm_start is False:
        return None
    if warm_start is True:
        return _generated(problem, fractions, deadline, alternatives)
    if not same_placement(warm_start.problem, problem):
        raise ProblemError(
            "warm_start", "its stages sit on other devices than the problem's; "
            "give a schedule of the same placement and microbatches",
        )  # fmt: skip
    # Re-time on this problem (objective and caps as solved) and check it fits.
    given = Schedule(problem=problem, ops=warm_start.ops, solver=warm_start.solver,
                     metrics=compute_metrics(problem, warm_start.ops),
                     variant=warm_start.variant)  # fmt: skip
    mine = "given", check_schedule(in_runtime_order(retime(given)))
    # A given schedule (a plan's refine passes its screening result) may come from a
    # shorter warm-start search than this solve allows: the generated ones compete too.
    generated = _generated(problem, fractions, deadline, alternatives)
    if generated is not None and generated[1].objective_value() < mine[1].objective_value():
        return generated
    return mine


def _generated(
    problem: Problem,
    fractions: Sequence[float],
    deadline: float,
    alternatives: list[Schedule] | None,
) -> tuple[str, Schedule] | None:
    """The best generated warm start the validator passes (see :func:`chosen_warm_start`)."""
    found = candidates(problem, fractions=fractions, deadline=deadline)
    for n, candidate in enumerate(found):
        try:
            chosen = candidate.name, check_schedule(candidate.schedule)
        except ValidationError as err:
            log.warning("warm start %s rejected: %s", candidate.name, err)
            continue
        if alternatives is not None and problem.offload:
            alternatives.extend(c.schedule for c in found[n + 1 : n + 1 + ALTERNATIVES])
        return chosen
    return None


ALTERNATIVES = 8
"""Warm starts besides the best one that an offload solve passes to the backend."""
