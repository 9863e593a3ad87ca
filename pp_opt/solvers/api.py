"""``solve``: one entry point for every backend, with the guarantees the backends do not give.

The API checks the caps first (raising with the smallest feasible cap), picks
the warm start, runs the backend, re-times the backend's op order with the
simulator (exact durations, the cross-stream waits of the solution), validates
the result with the independent validator, and never returns something worse
than the warm start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pp_opt.bounds import lower_bound
from pp_opt.dag import build_dag
from pp_opt.errors import PPOptError, ProblemError, ValidationError
from pp_opt.metrics import compute_metrics
from pp_opt.problem import OBJECTIVES, Problem
from pp_opt.schedule import Schedule, ScheduledOp, SolverInfo
from pp_opt.simulator import retime
from pp_opt.solvers.base import BackendResult, ProgressCallback, SolveOptions
from pp_opt.solvers.min_cap import check_caps
from pp_opt.solvers.warm_start import same_placement, warm_start_candidates

log = logging.getLogger(__name__)

SOLVERS = ("cpsat", "milp", "milp-highs")
"""``milp`` runs PuLP with CBC; ``milp-highs`` the same model with HiGHS."""


@dataclass(kw_only=True, slots=True, frozen=True)
class WarmStart:
    """The schedule a solve started from."""

    name: str
    """Baseline name, or ``given`` for a schedule passed in."""
    objective: float


@dataclass(kw_only=True, slots=True)
class SolveResult:
    """What :func:`solve` returns: a validated schedule and how it was found."""

    schedule: Schedule
    status: str
    """``optimal`` (proved) or ``feasible``; infeasible caps raise :class:`InfeasibleError`,
    and a backend that found nothing in time (``timeout``) hands over the warm start as
    ``feasible`` (its own status is kept in ``schedule.solver.extra["backend_status"]``)."""
    objective: float
    """The simulator's objective of :attr:`schedule` (re-timing its order gives it again)."""
    lower_bound: float
    gap: float
    seconds: float
    warm_start: WarmStart | None


def solve(
    problem: Problem,
    *,
    solver: str = "cpsat",
    time_limit: float = 60.0,
    threads: int = 2,
    seed: int = 0,
    objective: str | None = None,
    warm_start: bool | Schedule = True,
    progress: ProgressCallback | None = None,
    offload_fractions: Sequence[float] = (1.0,),
) -> SolveResult:
    """The best schedule a solver finds within ``time_limit``, never worse than the warm start.

    Parameters
    ----------
    problem
        What to schedule; its caps, placement and offload/recompute switches apply.
    solver
        ``cpsat`` (OR-Tools CP-SAT), ``milp`` (PuLP with CBC) or ``milp-highs`` (HiGHS).
    time_limit, threads, seed
        Wall-clock seconds, worker threads, random seed. The same seed and threads
        give the same schedule when the search ends before the time limit.
    objective
        ``makespan`` or ``span``; the problem's own when None.
    warm_start
        True: the best classic schedule that fits the caps and has the problem's
        placement. A :class:`Schedule`: that one. False: none.
    progress
        Called with each improving incumbent and bound.
    offload_fractions
        Fractions of an activation one offload may move (with ``problem.offload``).

    Returns
    -------
    SolveResult
        The validated schedule, status, objective, lower bound, gap and seconds.

    Raises
    ------
    InfeasibleError
        When no schedule fits the caps; ``min_cap`` is the smallest cap that does.
    """
    started = time.perf_counter()
    problem, options = _prepare(problem, solver, time_limit, threads, seed, objective,
                                progress, offload_fractions)  # fmt: skip
    check_caps(problem, options.offload_fractions if problem.offload else ())
    warm = _warm_start(problem, warm_start, options.offload_fractions)
    options.warm_start = warm[1] if warm else None
    dag = build_dag(problem)
    options.time_limit = max(0.1, time_limit - (time.perf_counter() - started))
    result = _backend(solver)(problem, dag, options)
    found = _checked(problem, result, solver)
    bound = lower_bound(problem, options.objective)
    if result.bound is not None:
        bound = max(bound, result.bound)
    chosen, status = found, result.status
    if warm is not None and (found is None or _value(warm[1]) < _value(found) - 1e-9):
        chosen, status = warm[1], "feasible"
    if chosen is None:
        raise PPOptError(
            f"{solver} found no schedule in {time_limit:g} s ({result.status}); raise --time-limit"
        )
    value = _value(chosen)
    bound = min(bound, value)
    gap = (value - bound) / value if value > 0 else 0.0
    seconds = time.perf_counter() - started
    warm_info = WarmStart(name=warm[0], objective=_value(warm[1])) if warm else None
    info = SolverInfo(
        name=solver,
        status=status,
        objective=value,
        lower_bound=bound,
        gap=gap,
        seconds=seconds,
        extra={
            "warm_start": None if warm is None else warm[0],
            "warm_start_objective": None if warm_info is None else warm_info.objective,
            "backend_status": result.status,
            "backend_objective": result.objective,
            "time_limit": time_limit,
            "threads": threads,
            "seed": seed,
        },
    )
    schedule = Schedule(problem=chosen.problem, ops=chosen.ops, solver=info, metrics=chosen.metrics)
    return SolveResult(schedule=schedule, status=status, objective=value, lower_bound=bound,
                       gap=gap, seconds=seconds, warm_start=warm_info)  # fmt: skip


def _prepare(
    problem: Problem,
    solver: str,
    time_limit: float,
    threads: int,
    seed: int,
    objective: str | None,
    progress: ProgressCallback | None,
    offload_fractions: Sequence[float],
) -> tuple[Problem, SolveOptions]:
    if solver not in SOLVERS:
        raise ProblemError("solver", f"unknown {solver!r}; use one of {', '.join(SOLVERS)}")
    objective = objective or problem.objective
    if objective not in OBJECTIVES:
        raise ProblemError("objective", f"unknown {objective!r}; use 'makespan' or 'span'")
    if not time_limit > 0:
        raise ProblemError("time_limit", f"got {time_limit}; give a number of seconds above 0")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ProblemError("threads", f"got {threads!r}; give an integer of at least 1")
    fractions = tuple(float(a) for a in offload_fractions)
    if not fractions or any(not 0 < a <= 1 for a in fractions):
        raise ProblemError("offload_fractions", f"got {fractions}; each must be in (0, 1]")
    if objective != problem.objective:
        problem = problem.replace(objective=objective)
    options = SolveOptions(time_limit=time_limit, threads=threads, seed=seed,
                           objective=objective, progress=progress,
                           offload_fractions=fractions)  # fmt: skip
    return problem, options


def _value(schedule: Schedule) -> float:
    return schedule.objective_value(schedule.problem.objective)


def _warm_start(
    problem: Problem, warm_start: bool | Schedule, fractions: Sequence[float]
) -> tuple[str, Schedule] | None:
    if warm_start is False:
        return None
    if warm_start is True:
        for name, schedule, validated in warm_start_candidates(problem, problem.objective,
                                                               fractions):  # fmt: skip
            if validated and schedule.problem == problem:
                return name, schedule
            try:
                return name, _validated(retime(_on(problem, schedule)))
            except ValidationError as err:
                log.info("warm start %s rejected: %s", name, err)
        return None
    if not same_placement(warm_start.problem, problem):
        raise ProblemError(
            "warm_start", "its stages sit on other devices than the problem's; "
            "give a schedule of the same placement and microbatches",
        )  # fmt: skip
    # Re-time on this problem (objective and caps as solved) and check it fits.
    return "given", _validated(retime(_on(problem, warm_start)))


def _on(problem: Problem, schedule: Schedule) -> Schedule:
    ops = schedule.ops
    return Schedule(problem=problem, ops=ops, solver=schedule.solver,
                    metrics=compute_metrics(problem, ops))  # fmt: skip


def _validated(schedule: Schedule) -> Schedule:
    from pp_opt.validator import check_schedule

    return check_schedule(schedule)


def _backend(solver: str):  # noqa: ANN202 - a backend function
    if solver in ("milp", "milp-highs"):
        from functools import partial

        from pp_opt.solvers.milp import solve_milp

        return partial(solve_milp, backend="highs" if solver == "milp-highs" else "cbc")
    from pp_opt.solvers.cpsat import solve_cpsat

    return solve_cpsat


def _checked(problem: Problem, result: BackendResult, solver: str) -> Schedule | None:
    """The backend's ops re-timed with exact durations and validated; None if unusable."""
    if not result.ops:
        return None
    ops: tuple[ScheduledOp, ...] = result.ops
    info = SolverInfo(name=solver, status=result.status, objective=0.0)
    raw = Schedule(problem=problem, ops=ops, solver=info, metrics=compute_metrics(problem, ops))
    try:
        return _validated(retime(raw, solver=info))
    except (ValidationError, PPOptError) as err:
        log.warning("%s result rejected: %s", solver, err)
        return None
