"""Step 5's unit of work: one candidate in, one scored candidate out, both plain data.

An :class:`EvaluationTask` carries the cards by value, so a worker process or a Ray task
needs nothing else; :func:`evaluate` profiles the candidate, solves it (or runs a named
baseline order), and scores the validated schedule with :mod:`pp_opt.planner.step`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pp_opt.errors import InfeasibleError, PPOptError, StaticMemoryError, TimeLimitError
from pp_opt.job import Job
from pp_opt.planner.config import Candidate, PlanInputs
from pp_opt.planner.infeasible import need_note, peak_term
from pp_opt.planner.memory import memory_breakdown
from pp_opt.planner.problems import OFFLOAD_FRACTIONS, candidate_problem, candidate_profile
from pp_opt.planner.step import dp_sync_ms, gradients_ready, step_time
from pp_opt.problem import Problem
from pp_opt.profiler.cards import GIB
from pp_opt.profiler.costs import CostProfile
from pp_opt.profiler.stacks import load_stack_card
from pp_opt.profiler.step_terms import (
    profile_fsdp_exposed_ms,
    profile_optimizer_ms,
    profile_reduce_ms,
)
from pp_opt.schedule import Schedule
from pp_opt.solvers.process.stop import StopToken

SOLVED = "solve"
"""The order of a job solved by :func:`pp_opt.solve` (any other order is a baseline's)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class EvaluationTask:
    """One candidate to evaluate."""

    inputs: PlanInputs
    """The training job."""
    candidate: Candidate
    """What to evaluate."""
    order: str = SOLVED
    """:data:`SOLVED`, or a PyTorch schedule name (``1F1B``, ``Interleaved1F1B``)."""
    time_limit: float = 5.0
    """Seconds for the solve."""
    threads: int = 1
    """Solver threads."""
    seed: int = 0
    """Solver seed."""
    warm_start: dict[str, Any] | None = None
    """A schedule (its JSON dict) of the same candidate to start from."""
    label: str = ""
    """A baseline's name (``torchtitan``, ``megatron``), empty for the plan's own."""


@dataclass(kw_only=True, slots=True)
class Scored:
    """What one job gave (times in ms, memory in bytes)."""

    candidate: Candidate
    """The candidate."""
    order: str
    """The job's order."""
    label: str = ""
    """The job's label."""
    status: str
    """The schedule's status (``optimal``, ``feasible``, ``heuristic``), or ``infeasible``,
    ``timeout`` or ``error`` when there is none (``note`` says why)."""
    iteration_makespan: float | None = None
    """Makespan of one pipeline's schedule (None: no schedule)."""
    dp_sync: float | None = None
    """Gradient all-reduce time past the makespan (:mod:`pp_opt.planner.step`)."""
    optimizer_step: float | None = None
    """Optimizer step of the slowest device."""
    step_time: float | None = None
    """``iteration_makespan + dp_sync + optimizer_step``."""
    tokens_per_s_per_gpu: float | None = None
    """Tokens per second per GPU."""
    mfu: float | None = None
    """Model FLOPs utilisation."""
    peak_memory: list[float] = field(default_factory=list)
    """Per device: static plus activation memory at its peak, as reported (reserved bytes,
    :func:`pp_opt.planner.memory.reported_peak_memory`)."""
    memory_breakdown: list[dict[str, float]] = field(default_factory=list)
    """Per device: the named terms of its peak, ``allocated`` and ``reserved`` (bytes; the
    terms add up to ``peak_memory``, :mod:`pp_opt.profiler.memory_breakdown`)."""
    memory_bound: bool = False
    """Some device lacks room for one more of its largest activations at its peak."""
    static_memory: float = 0.0
    """The largest device's memory beside its activations (bytes; the profile's ``static``:
    weights, gradients, optimizer state, buffers): what the candidate fixes, whichever
    schedule the solver found."""
    gap: float | None = None
    """The schedule's gap to its makespan lower bound."""
    lower_bound: float | None = None
    """The makespan lower bound."""
    seconds: float = 0.0
    """Wall-clock seconds of the job."""
    time_limit: float = 0.0
    """The job's time limit."""
    schedule: dict[str, Any] | None = None
    """The validated schedule's JSON dict."""
    note: str = ""
    """Why there is no schedule."""
    largest_term: str = ""
    """An infeasible candidate's peak rank's largest memory term and its peak ("activations
    61.0 GiB of 95.0", :func:`pp_opt.planner.infeasible.peak_term`); "" otherwise."""

    @property
    def job(self) -> Job:
        """The configuration: degrees, chunks, microbatching, optimizer sharding, layers."""
        return self.candidate.job

    @property
    def layers(self) -> tuple[int, ...]:
        """Decoder layers per stage."""
        return self.candidate.job.layers

    @property
    def ok(self) -> bool:
        return self.step_time is not None

    def sort_key(self) -> tuple[Any, ...]:
        """Rank: step time, then static memory (of equally fast ones the leaner first), then
        the candidate's fixed order. Not the peak: a problem has many optimal schedules whose
        activation peaks differ, and which one a solve returns may depend on the machine's
        load (a warm start or a bound cut by its share of the time), so a ranking by it
        would differ from one executor to another."""
        value = float("inf") if self.step_time is None else round(self.step_time, 6)
        memory = round(self.static_memory) if self.step_time is not None else float("inf")
        return (value, memory, self.candidate.key())

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"config": self.candidate.to_dict()}
        if self.label:
            out["name"] = self.label
        out["schedule"] = "pp_opt" if self.order == SOLVED else self.order
        for key in ("iteration_makespan", "dp_sync", "optimizer_step", "step_time",
                    "tokens_per_s_per_gpu", "mfu"):  # fmt: skip
            out[key] = getattr(self, key)
        out["peak_memory"] = list(self.peak_memory)
        if self.memory_breakdown:
            out["memory_breakdown"] = [dict(rank) for rank in self.memory_breakdown]
        out["memory_bound"] = self.memory_bound
        out["status"] = self.status
        out["gap"] = self.gap
        out["lower_bound"] = self.lower_bound
        out["seconds"] = self.seconds
        if self.note:
            out["note"] = self.note
        if self.largest_term:
            out["largest_term"] = self.largest_term
        return out


def evaluate(job: EvaluationTask, *, stop: StopToken | None = None) -> Scored:
    """Solve (or run the baseline order of) ``job`` and score its schedule; ``stop`` ends a
    solve in this process early (workers in other processes get no token: it does not pickle)."""
    started = time.perf_counter()
    base = Scored(candidate=job.candidate, order=job.order, label=job.label, status="",
                  time_limit=job.time_limit)  # fmt: skip
    profile = problem = None
    try:
        profile = candidate_profile(job.inputs, job.candidate)
        problem = candidate_problem(job.candidate, profile)
        schedule = _schedule(job, problem, stop)
    except InfeasibleError as err:
        base.status, base.note = "infeasible", str(err)
        if problem is not None and profile is not None:
            base.note = need_note(err, profile)  # the need as the card's memory
            order = None if job.order == SOLVED else job.order
            base.largest_term = peak_term(order, problem, profile)
    except TimeLimitError as err:
        base.status, base.note = "timeout", str(err)
    except StaticMemoryError as err:  # weights, gradients and optimizer state alone overflow
        base.status, base.note = "infeasible", str(err)
        base.largest_term = (
            f"static memory {err.need / GIB:.1f} GiB of {err.cap / GIB:.1f} GiB usable"
        )
    except PPOptError as err:  # a problem the solver refuses must not end the whole plan
        base.status, base.note = "error", str(err)
    else:
        _score(base, job, schedule, profile)
    base.seconds = time.perf_counter() - started
    return base


def _schedule(job: EvaluationTask, problem: Problem, stop: StopToken | None) -> Schedule:
    if job.order != SOLVED:
        from pp_opt.planner.baselines import run_baseline

        return run_baseline(job.order, problem)
    from pp_opt.schedule_io import schedule_from_dict
    from pp_opt.solvers import solve

    warm: bool | Schedule = True
    if job.warm_start is not None:
        warm = schedule_from_dict(job.warm_start)
    result = solve(problem, time_limit=job.time_limit, threads=job.threads, seed=job.seed,
                   warm_start=warm, offload_fractions=OFFLOAD_FRACTIONS, stop=stop)  # fmt: skip
    return result.schedule


def _score(out: Scored, job: EvaluationTask, schedule: Schedule, profile: CostProfile) -> None:
    from pp_opt.schedule_io import schedule_to_dict

    problem = schedule.problem
    config = job.candidate.job
    makespan = schedule.metrics.makespan
    devices = [st.device for st in problem.stages]
    sync = dp_sync_ms(gradients_ready(schedule), devices, profile_reduce_ms(profile), makespan)
    sync += profile_fsdp_exposed_ms(profile)
    optimizer = profile_optimizer_ms(profile)
    figures = step_time(job.inputs, config, makespan=makespan, dp_sync=sync,
                        optimizer_step=optimizer)  # fmt: skip
    out.iteration_makespan = figures.iteration_makespan
    out.dp_sync = figures.dp_sync
    out.optimizer_step = figures.optimizer_step
    out.step_time = figures.step_time
    out.tokens_per_s_per_gpu = figures.tokens_per_s_per_gpu
    out.mfu = figures.mfu
    out.memory_breakdown = memory_breakdown(profile, schedule)
    reported = load_stack_card(config.stack).memory_report  # what its numbers mean
    out.peak_memory = [rank[reported] for rank in out.memory_breakdown]
    out.static_memory = max(dev.static for dev in problem.devices)
    out.memory_bound = any(
        rank["allocated"] + max(problem.stages[s].m_b for s in problem.stages_on(d))
        > problem.devices[d].cap
        for d, rank in enumerate(out.memory_breakdown)
    )
    out.status = str(schedule.solver.status)
    out.gap = schedule.solver.gap
    out.lower_bound = schedule.solver.lower_bound
    out.schedule = schedule_to_dict(schedule)
