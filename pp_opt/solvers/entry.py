"""``solve``: one entry point for every backend, with the guarantees the backends do not give.

It checks the caps first (raising with the smallest feasible cap), picks the warm start
within a share of the time limit, runs the backend with the time left, re-times the
backend's op order with the simulator (exact durations, the cross-stream waits of the
solution), validates the result with the independent validator, and never returns
something worse than the warm start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial

import networkx as nx

from pp_opt.arguments import check_solve
from pp_opt.bounds import check_caps, lower_bound
from pp_opt.dag import dag_for
from pp_opt.errors import PPOptError, ProblemError, TimeLimitError
from pp_opt.metrics import compute_metrics
from pp_opt.order import Variant
from pp_opt.orders import candidates
from pp_opt.orders.common import same_placement
from pp_opt.problem import OBJECTIVES, Problem
from pp_opt.runtime_rules import in_runtime_order
from pp_opt.schedule import Schedule, ScheduledOp, SolverInfo, Status
from pp_opt.simulator import retime
from pp_opt.solvers.base import BackendResult, ProgressCallback, SolveOptions
from pp_opt.solvers.result import SolveResult, WarmStart
from pp_opt.validator import ValidationError, check_schedule

log = logging.getLogger(__name__)

SOLVERS = ("cpsat", "milp", "milp-highs")
"""``milp`` runs PuLP with CBC; ``milp-highs`` the same model with HiGHS."""

WARM_START_SHARE = 0.5
"""Share of the time limit after which no further warm-start generator starts; the
backend gets whatever is left. Small problems list every warm start in milliseconds;
large ones keep the cheapest (the classic schedules come first)."""

Backend = Callable[[Problem, nx.DiGraph, SolveOptions], BackendResult]


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
    time_limit
        Wall-clock seconds for the whole solve: warm starts (at most about
        :data:`WARM_START_SHARE` of it), the backend, and the final checks.
    threads, seed
        Worker threads and random seed. The same seed and threads give the same
        schedule when the search ends before the time limit.
    objective
        ``makespan`` or ``span``; the problem's own when None.
    warm_start
        True: the best warm start of :func:`pp_opt.orders.candidates` (classic schedules
        and rules that keep the problem's placement and fit its caps). A
        :class:`Schedule`: that one. False: none.
    progress
        Called with each improving incumbent and bound.
    offload_fractions
        Fractions of an activation one offload may move (with ``problem.offload``).

    Returns
    -------
    SolveResult
        The validated schedule (status, objective, lower bound, gap and seconds in its
        ``solver`` record) and the warm start.

    Raises
    ------
    InfeasibleError
        When no schedule fits the caps; ``min_cap`` is the smallest cap that does.
    ProblemError
        For a bad argument, or when nothing was found within ``time_limit``.
    """
    started = time.perf_counter()
    problem, options = _prepare(problem, solver, time_limit, threads, seed, objective,
                                progress, offload_fractions, warm_start)  # fmt: skip
    check_caps(problem, options.offload_fractions if problem.offload else ())
    deadline = started + WARM_START_SHARE * time_limit
    warm = _warm_start(problem, warm_start, options.offload_fractions, deadline)
    options.warm_start = warm[1] if warm else None
    left = time_limit - (time.perf_counter() - started)
    if left > 0:
        options.time_limit = max(0.1, left)
        result = _backend(solver)(problem, dag_for(problem), options)
    else:  # the warm starts used all the time: the backend gets none
        result = BackendResult(status=Status.TIMEOUT, objective=None, bound=None, seconds=0.0,
                               ops=None)  # fmt: skip
    found = _checked(problem, result, solver)
    bound = lower_bound(problem, options.objective)
    if result.bound is not None:
        bound = max(bound, result.bound)
    chosen, status = found, result.status
    if warm is not None and (found is None or _value(warm[1]) < _value(found) - 1e-9):
        chosen, status = warm[1], Status.FEASIBLE
    if chosen is None:
        raise TimeLimitError(
            "time_limit",
            f"{solver} found no schedule in {time_limit:g} s ({result.status}); raise it",
        )
    value = _value(chosen)
    bound = min(bound, value)
    gap = (value - bound) / value if value > 0 else 0.0
    warm_info = WarmStart(name=warm[0], objective=_value(warm[1])) if warm else None
    info = SolverInfo(
        name=solver,
        status=status,
        objective=value,
        lower_bound=bound,
        gap=gap,
        seconds=time.perf_counter() - started,
        extra={
            "warm_start": None if warm_info is None else warm_info.name,
            "warm_start_objective": None if warm_info is None else warm_info.objective,
            "backend_status": result.status,
            "backend_objective": result.objective,
            "time_limit": time_limit,
            "threads": threads,
            "seed": seed,
        },
    )
    schedule = Schedule(problem=chosen.problem, ops=chosen.ops, solver=info,
                        metrics=chosen.metrics, variant=chosen.variant)  # fmt: skip
    return SolveResult(schedule=schedule, warm_start=warm_info)


def _prepare(
    problem: Problem,
    solver: str,
    time_limit: float,
    threads: int,
    seed: int,
    objective: str | None,
    progress: ProgressCallback | None,
    offload_fractions: Sequence[float],
    warm_start: bool | Schedule = True,
) -> tuple[Problem, SolveOptions]:
    check_solve(problem=problem, time_limit=time_limit, threads=threads, seed=seed,
                warm_start=warm_start, progress=progress,
                offload_fractions=offload_fractions)  # fmt: skip
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
    problem: Problem,
    warm_start: bool | Schedule,
    fractions: Sequence[float],
    deadline: float,
) -> tuple[str, Schedule] | None:
    """The first warm start (best objective first) that the validator passes."""
    if warm_start is False:
        return None
    if warm_start is True:
        for candidate in candidates(problem, fractions=fractions, deadline=deadline):
            try:
                return candidate.name, check_schedule(candidate.schedule)
            except ValidationError as err:
                log.warning("warm start %s rejected: %s", candidate.name, err)
        return None
    if not same_placement(warm_start.problem, problem):
        raise ProblemError(
            "warm_start", "its stages sit on other devices than the problem's; "
            "give a schedule of the same placement and microbatches",
        )  # fmt: skip
    # Re-time on this problem (objective and caps as solved) and check it fits.
    given = Schedule(problem=problem, ops=warm_start.ops, solver=warm_start.solver,
                     metrics=compute_metrics(problem, warm_start.ops),
                     variant=warm_start.variant)  # fmt: skip
    return "given", check_schedule(in_runtime_order(retime(given)))


def _backend(solver: str) -> Backend:
    """The backend's entry point, imported only now (OR-Tools and PuLP load slowly)."""
    if solver in ("milp", "milp-highs"):
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
    raw = Schedule(problem=problem, ops=ops, solver=info, metrics=compute_metrics(problem, ops),
                   variant=Variant.of_problem(problem))  # fmt: skip
    try:
        return check_schedule(retime(raw, solver=info))
    except PPOptError as err:
        log.warning("%s result rejected: %s", solver, err)
        return None
