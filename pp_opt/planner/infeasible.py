"""Why a candidate does not fit its GPUs: the largest named term of its peak rank.

A candidate the plan calls infeasible has no schedule within the caps. Its memory is shown
for the schedule it was evaluated with (a baseline's own order), or, for a solve, the
framework's order for its placement (``1F1B``, ``Interleaved1F1B``, ``ZBVZeroBubble``),
each run with the caps lifted: the peak rank's largest term of
:func:`pp_opt.profiler.memory_breakdown.largest_term` ("activations 61.0 GiB of 95.0").
"""

from __future__ import annotations

from dataclasses import replace

from pp_opt.errors import InfeasibleError, PPOptError
from pp_opt.planner.memory import memory_breakdown
from pp_opt.problem import Problem
from pp_opt.profiler.costs import CostProfile
from pp_opt.profiler.memory_breakdown import held_bytes_per_device, largest_term, usable_needed
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


def need_note(err: InfeasibleError, profile: CostProfile) -> str:
    """What a candidate that fits no cap needs, as the card's usable memory per GPU (the
    solver's caps count allocated bytes, the card and the peaks reserved ones)."""
    hw, d = profile.hardware, err.device
    if err.unit != "bytes" or not 0 <= d < len(profile.static):
        return str(err)
    held = held_bytes_per_device(profile.job, profile.stages)[d]
    need = usable_needed(hw, profile.job, profile.static[d], held, err.need)
    what = f"{err.schedule} needs" if err.schedule else "no schedule fits: it needs at least"
    return (f"{what} {need / 2**30:.2f} GiB usable on pipeline rank {d}; {hw.name} has "
            f"{hw.usable_bytes / 2**30:.1f} ({hw.hbm_gib:g} GiB less a {hw.reserve_gib:g} GiB "
            "reserve)")  # fmt: skip
