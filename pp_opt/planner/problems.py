"""Steps 2 and 4 of a plan: the problem a candidate is solved as, and its bounds.

The profiler is the one place of costs: a candidate's job (layer split, tensor-parallel
collectives, the static bytes its optimizer sharding gives) is profiled into a
:class:`~pp_opt.profiler.costs.CostProfile`, which is kept beside the problem built from it
(the step time's parameters come from the profile, never from ``Problem.extra``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pp_opt.bounds import lower_bound, min_feasible_cap
from pp_opt.errors import ProblemError, StaticMemoryError
from pp_opt.planner.config import Candidate, PlanInputs
from pp_opt.planner.step import dp_sync_bound
from pp_opt.problem import Problem
from pp_opt.profiler.analytic import profile_analytic
from pp_opt.profiler.costs import CostProfile, problem_from_profile
from pp_opt.profiler.layer_split import job_for_card
from pp_opt.profiler.step_terms import (
    profile_fsdp_exposed_ms,
    profile_optimizer_ms,
    profile_reduce_ms,
)

OFFLOAD_FRACTIONS = (1.0,)
"""Offload fractions a plan's solves allow (when offload is on)."""


def candidate_profile(inputs: PlanInputs, candidate: Candidate) -> CostProfile:
    """The cost profile of ``candidate``'s job (the same as ``pp-opt profile`` gives)."""
    return profile_analytic(
        inputs.model, inputs.hardware, job_for_card(inputs.model, candidate.job)
    )


def candidate_problem(candidate: Candidate, profile: CostProfile) -> Problem:
    """The problem of one pipeline of ``candidate`` (memory in bytes, times in ms)."""
    problem = problem_from_profile(profile)
    return problem.replace(recompute=candidate.recompute, offload=candidate.offload,
                           name=candidate.label())  # fmt: skip


def build_problem(inputs: PlanInputs, candidate: Candidate) -> Problem:
    """The problem of one pipeline of ``candidate``, profiled."""
    return candidate_problem(candidate, candidate_profile(inputs, candidate))


@dataclass(kw_only=True, slots=True, frozen=True)
class Bounded:
    """A candidate with what holds for every schedule of it."""

    candidate: Candidate
    """The candidate."""
    infeasible: str | None = None
    """Why no schedule fits (None: some does)."""
    makespan_bound: float = 0.0
    """:func:`pp_opt.lower_bound` of its problem (ms)."""
    step_bound: float = 0.0
    """A lower bound on its step time: the makespan bound, the least any stage's all-reduce
    adds, and the optimizer step (ms)."""


def bound_candidate(inputs: PlanInputs, candidate: Candidate) -> Bounded:
    """Bounds of ``candidate``, or why it cannot fit its devices' memory."""
    try:
        profile = candidate_profile(inputs, candidate)
        problem = candidate_problem(candidate, profile)
    except StaticMemoryError:  # weights, gradients and optimizer state alone overflow
        return Bounded(candidate=candidate, infeasible="static memory over the cap")
    except ProblemError as err:
        return Bounded(candidate=candidate, infeasible=f"rejected by the profiler ({err.field})")
    cap = min(d.cap for d in problem.devices)
    if min_feasible_cap(problem, OFFLOAD_FRACTIONS) > cap * (1 + 1e-12):
        return Bounded(candidate=candidate, infeasible="activation memory over the cap")
    makespan = lower_bound(problem, offload_fractions=OFFLOAD_FRACTIONS)
    reduce = profile_reduce_ms(profile)
    optimizer = profile_optimizer_ms(profile) + profile_fsdp_exposed_ms(profile)
    return Bounded(candidate=candidate, makespan_bound=makespan,
                   step_bound=makespan + dp_sync_bound(reduce) + optimizer)  # fmt: skip
