"""Steps 2 and 4 of a plan: the problem a candidate is solved as, and its bounds.

The profiler is the one place of costs: a candidate's problem is profiled with its layer
split, its tensor-parallel collectives, and the static bytes its optimizer sharding gives
(:func:`pp_opt.profiler.analytic.bytes_per_param`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pp_opt.bounds import lower_bound, min_feasible_cap
from pp_opt.errors import ProblemError
from pp_opt.plan.config import Candidate, PlanInputs
from pp_opt.plan.step import dp_sync_bound, optimizer_ms, stage_all_reduce_ms
from pp_opt.problem import Problem
from pp_opt.problem_io import problem_from_costs
from pp_opt.profiler import profile_costs
from pp_opt.profiler.analytic import bytes_per_param

OFFLOAD_FRACTIONS = (1.0,)
"""Offload fractions a plan's solves allow (when offload is on)."""


def build_problem(inputs: PlanInputs, candidate: Candidate) -> Problem:
    """The problem of one pipeline of ``candidate`` (memory in bytes, times in ms)."""
    c = candidate.config
    data = profile_costs(
        model=inputs.model, hardware=inputs.hardware, pp=c.pp, v=c.v, placement=c.placement,
        microbatches=c.m, mbs=c.mbs, seq=inputs.seq, tp=c.tp, layers=list(candidate.layers),
        bytes_per_param=bytes_per_param(dp=c.dp, optimizer_sharding=c.optimizer_sharding),
        tp_comm=True,
    )  # fmt: skip
    problem = problem_from_costs(data)
    return problem.replace(recompute=c.recompute, offload=c.offload, name=c.label())


def stage_params(problem: Problem) -> list[float]:
    """Parameters per stage and GPU, from the profile the problem was made from."""
    return [float(st["params"]) for st in problem.extra["profile"]["stages"]]


def device_params(problem: Problem) -> list[float]:
    params = stage_params(problem)
    out = [0.0] * problem.p
    for s, st in enumerate(problem.stages):
        out[st.device] += params[s]
    return out


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
        problem = build_problem(inputs, candidate)
    except ProblemError as err:
        if err.field == "hardware":  # weights, gradients and optimizer state alone overflow
            return Bounded(candidate=candidate, infeasible="static memory over the cap")
        return Bounded(candidate=candidate, infeasible=f"rejected by the profiler ({err.field})")
    cap = min(d.cap for d in problem.devices)
    if min_feasible_cap(problem, OFFLOAD_FRACTIONS) > cap * (1 + 1e-12):
        return Bounded(candidate=candidate, infeasible="activation memory over the cap")
    makespan = lower_bound(problem, offload_fractions=OFFLOAD_FRACTIONS)
    reduce = stage_all_reduce_ms(inputs, candidate.config, stage_params(problem))
    optimizer = optimizer_ms(inputs, candidate.config, device_params(problem))
    return Bounded(candidate=candidate, makespan_bound=makespan,
                   step_bound=makespan + dp_sync_bound(reduce) + optimizer)  # fmt: skip
