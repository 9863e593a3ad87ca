"""Entry points that tie the pieces together for the CLI and for planners calling from Python."""

from __future__ import annotations

from dataclasses import replace

from pp_opt.problem import Problem
from pp_opt.schedule import Schedule


def with_lower_bound(schedule: Schedule) -> Schedule:
    """Attach the problem's lower bound and the schedule's gap to it (for any schedule)."""
    from pp_opt.bounds import lower_bound

    objective = schedule.problem.objective
    bound = lower_bound(schedule.problem, objective)
    value = schedule.objective_value(objective)
    gap = (value - bound) / value if value > 0 else 0.0
    solver = replace(schedule.solver, objective=value, lower_bound=bound, gap=max(gap, 0.0))
    return replace(schedule, solver=solver)


def run_baseline(name: str, problem: Problem) -> Schedule:
    """A classic schedule, timed, validated (caps included), with its lower bound and gap."""
    from pp_opt.baselines import make_baseline

    return with_lower_bound(make_baseline(name, problem))
