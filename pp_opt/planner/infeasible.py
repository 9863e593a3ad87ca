"""Why a candidate does not fit its GPUs: the largest named term of its peak rank.

A candidate the plan calls infeasible has no schedule within the caps. Its memory is shown
for the schedule it was evaluated with (a baseline's own order), or, for a solve, the
framework's order for its placement (``1F1B``, ``Interleaved1F1B``, ``ZBVZeroBubble``),
each run with the caps lifted: the peak rank's largest term of
:func:`pp_opt.profiler.memory_breakdown.largest_term` ("activations 61.0 GiB of 95.0").
"""

from __future__ import annotations

from dataclasses import replace

from pp_opt.errors import PPOptError
from pp_opt.planner.memory import memory_breakdown
from pp_opt.problem import Problem
from pp_opt.profiler.costs import CostProfile
from pp_opt.profiler.memory_breakdown import largest_term
from pp_opt.profiler.stacks import load_stack_card

NO_CAP = 1e30
"""A cap no schedule reaches (a problem's caps are finite)."""


def framework_order(problem: Problem) -> str:
    """PyTorch's schedule for ``problem``'s placement and chunks."""
    if problem.placement == "v":
        return "ZBVZeroBubble"
    return "1F1B" if problem.v == 1 else "Interleaved1F1B"


def peak_term(order: str | None, problem: Problem, profile: CostProfile) -> str:
    """``"activations 61.0 GiB of 95.0"`` of ``order`` (None, a solve: the framework's) on
    ``problem`` with its caps lifted, at the rank whose reported peak is largest; "" when
    that order cannot run the problem."""
    from pp_opt.planner.baselines import run_baseline

    name = framework_order(problem) if order is None else order
    try:
        devices = tuple(replace(d, cap=NO_CAP) for d in problem.devices)
        schedule = run_baseline(name, problem.replace(devices=devices))
    except PPOptError:
        return ""
    reported = load_stack_card(profile.job.stack).memory_report
    ranks = memory_breakdown(profile, schedule)
    return largest_term(max(ranks, key=lambda rank: rank[reported]), total=reported)
