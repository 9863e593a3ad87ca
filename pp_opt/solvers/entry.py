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
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

import networkx as nx

from pp_opt.arguments import check_solve
from pp_opt.bounds import check_caps, lower_bound
from pp_opt.dag import dag_for, op_count
from pp_opt.errors import ProblemError, TimeLimitError
from pp_opt.problem import OBJECTIVES, Problem
from pp_opt.schedule import Schedule, SolverInfo, Status
from pp_opt.solvers.base import (
    BackendResult,
    Progress,
    ProgressCallback,
    SolveOptions,
    pins_copies,
)
from pp_opt.solvers.pair_phases import decides_pairs, pairs_open, unpaired_first
from pp_opt.solvers.process.isolation import (
    fluid_isolated,
    improve_isolated,
    isolated,
    run_isolated,
)
from pp_opt.solvers.process.stop import StopToken, guarded, running_search
from pp_opt.solvers.result import SolveResult, WarmStart
from pp_opt.solvers.timing import checked_result
from pp_opt.solvers.warm import Warm, with_warm_start

if TYPE_CHECKING:
    from pp_opt.solvers.fluid import FluidBound

log = logging.getLogger(__name__)

SOLVERS = ("cpsat", "milp", "milp-highs")
"""``milp`` runs PuLP with CBC; ``milp-highs`` the same model with HiGHS."""

FULL_MODEL_OPS = 3000
"""Above this many ops a CP-SAT solve skips the full model: it rarely improves a good warm
start there within minutes, and building it takes seconds. The large-neighbourhood
search (:mod:`pp_opt.solvers.lns`) improves the warm start instead."""

FULL_MODEL_SHARE = 0.25
"""Share of the time left after the warm starts that the full CP-SAT model gets when the
large-neighbourhood search follows it (problems above :data:`FULL_MODEL_ALONE_OPS`)."""

FULL_MODEL_ALONE_OPS = 600
"""Up to this many ops the full CP-SAT model gets all the time left after the warm
starts: there it proves optima or finds the best schedules, and the large-neighbourhood
search only runs if time is left. Above it the model gets :data:`FULL_MODEL_SHARE` and
the search, restarting with new windows whenever it is stuck, the rest."""

PINNED_BACKEND_SHARE = 0.9
"""Share of the time left after the warm starts that a CP-SAT backend gets where it places
an offload order's copies window by window first (:func:`pp_opt.solvers.base.pins_copies`;
most of it goes to that, :data:`pp_opt.solvers.cpsat.PINNED_SHARE`); the search gets the
rest. On the ``v`` offload family at m 32 (``bench_solvers.py --parts v-offload``) the
default quarter ended the windows half way."""

WARM_START_SHARE = 0.5
"""Share of the time limit after which no further warm-start generator starts; the
backend gets whatever is left. Small problems list every warm start in milliseconds;
large ones keep the cheapest (the classic schedules come first)."""

SEARCH_START_SECONDS_PER_OP = 2e-5
"""The search starts only with at least this many seconds per op left: shipping the
schedule to its child process and cutting its first window take about that long (a
schedule of 120,000 ops needs 2.4 s), so a shorter remainder would overrun the limit."""

FLUID_SHARE = 0.1
"""Share of the time limit the fluid bound (:mod:`pp_opt.solvers.fluid`) may use, after the
warm starts and before the backend, where it applies (makespan, no offload or recompute,
more than :data:`~pp_opt.solvers.fluid.FLUID_MIN_DEVICE_OPS` ops on a device). On the
tight ``v`` rows of ``bench_solvers.py --parts tight`` (60 s) its 7 s raise the bound by
5-14% (1302.37 -> 1366.47 on 1.5B V-Min, 3229.30 -> 3501.47 on 28.3B V-Min)."""

FLUID_MIN_SECONDS = 0.5
"""Below this the fluid bound is not tried: one of its linear programs takes about that."""

Backend = Callable[[Problem, nx.DiGraph, SolveOptions], BackendResult]


@isolated  # the backend and the search run in a child process (pp_opt.solvers.process)
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
    stop: StopToken | None = None,
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
    stop
        A :class:`~pp_opt.solvers.process.stop.StopToken` the caller made:
        ``stop.request(reason)`` (from any thread) ends the solve early with the best
        schedule found so far. None: nothing but the time limit ends it (the command line
        passes the token its signal handler requests).

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
                                progress, offload_fractions, warm_start, stop)  # fmt: skip
    end = started + time_limit
    fractions = options.offload_fractions
    check_caps(problem, fractions if problem.offload else ())
    warm, options = with_warm_start(problem, options, warm_start,
                                    started + WARM_START_SHARE * time_limit)  # fmt: skip
    bound = lower_bound(problem, options.objective, offload_fractions=fractions)
    fluid = _fluid(problem, options, bound, end)
    bound = bound if fluid is None else max(bound, fluid.value)
    if solver == "cpsat" and pairs_open(problem):  # without pairs first (pair_phases)
        run = partial(_backend_phase, solver, bound=bound, fluid=False)
        options, warm = unpaired_first(problem, options, warm, end, run,
                                       partial(checked_result, problem, solver=solver))  # fmt: skip
    result = _backend_phase(solver, problem, options, bound, end, fluid=fluid is not None)
    bound = bound if result.bound is None else max(bound, result.bound)
    checked = checked_result(problem, result, solver)
    chosen = _better(checked, warm, solver, result.status, time_limit)
    searched = _search_phase(solver, chosen, options, bound, started, end,
                             within=(1 + result.rounding) ** 2 - 1)  # fmt: skip
    return _result(solver, searched, options, bound, result, warm, fluid,
                   seconds=time.perf_counter() - started)  # fmt: skip


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
    stop: StopToken | None = None,
) -> tuple[Problem, SolveOptions]:
    check_solve(problem=problem, time_limit=time_limit, threads=threads, seed=seed,
                warm_start=warm_start, progress=progress,
                offload_fractions=offload_fractions)  # fmt: skip
    if solver not in SOLVERS:
        raise ProblemError("solver", f"unknown {solver!r}; use one of {', '.join(SOLVERS)}")
    if problem.placement == "dual":
        raise ProblemError("placement", "the dual placement is DeepSeek's DualPipe baseline "
                           "only; solve the v placement (DualPipeV's) instead")  # fmt: skip
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
    if stop is not None and not isinstance(stop, StopToken):
        raise ProblemError("stop", f"got {type(stop).__name__}; give a StopToken or None")
    if objective != problem.objective:
        problem = problem.replace(objective=objective)
    options = SolveOptions(time_limit=time_limit, threads=threads, seed=seed,
                           objective=objective,
                           progress=None if progress is None else _Reporter(progress),
                           offload_fractions=fractions,
                           stop=stop)  # fmt: skip
    return problem, options


def _backend_phase(
    solver: str, problem: Problem, options: SolveOptions, bound: float, end: float, *, fluid: bool
) -> BackendResult:
    """The backend's run, or a skipped one where it has nothing to add: a CP-SAT model
    over :data:`FULL_MODEL_OPS` ops (the search improves the warm start instead), or a warm
    start the fluid bound proved optimal. CP-SAT gets :data:`FULL_MODEL_SHARE` of the time
    left above :data:`FULL_MODEL_ALONE_OPS` ops (the search gets the rest)."""
    warm = options.warm_start
    search = solver == "cpsat" and warm is not None
    ops = op_count(problem)  # the DAG is built only when the backend needs it
    full = not (search and ops > FULL_MODEL_OPS)
    if fluid and warm is not None and _proved(_value(warm), bound):
        full = False  # the fluid bound proves the warm start optimal
    if not full:
        return _skipped()
    share = FULL_MODEL_SHARE if search and ops > FULL_MODEL_ALONE_OPS else 1.0
    if search and pins_copies(problem):
        share = max(share, PINNED_BACKEND_SHARE)  # the pinned copies need it (cpsat.pinned)
    result = _run_backend(solver, problem, dag_for(problem), options, end, share=share)
    # Where pairs may form that the backend does not decide, its bound is not the problem's.
    return result if decides_pairs(solver, problem) else replace(result, bound=None)


def _better(
    found: Schedule | None, warm: Warm, solver: str, status: Status, time_limit: float
) -> Schedule:
    """The backend's schedule, or the warm start where that is better, as good with less
    memory on its fullest device, or nothing was found; raises :class:`TimeLimitError` when
    there is neither."""
    if warm is not None and (
        found is None or _value(warm[1]) < _value(found) - 1e-9 or _lighter(warm[1], found)
    ):
        return warm[1]
    if found is None:
        raise TimeLimitError(
            "time_limit",
            f"{solver} found no schedule in {time_limit:g} s ({status}); raise it",
        )
    return found


def _lighter(a: Schedule, b: Schedule) -> bool:
    """``a`` ties ``b``'s objective with a lower peak on its fullest device: of two equal
    schedules the one that leaves memory free is the one to run."""
    tie = 1e-9 * max(1.0, abs(_value(b)))
    if abs(_value(a) - _value(b)) > tie:
        return False
    peak_a, peak_b = max(a.metrics.peak_memory), max(b.metrics.peak_memory)
    return peak_a < peak_b - 1e-9 * max(1.0, abs(peak_b))


def _search_phase(
    solver: str,
    chosen: Schedule,
    options: SolveOptions,
    bound: float,
    started: float,
    end: float,
    *,
    within: float = 0.0,
) -> tuple[Schedule, int, int]:
    """CP-SAT solves get a large-neighbourhood search after the full model (or instead of
    it, when the model is too large to search well): it improves a valid schedule. Returns
    the best schedule, the windows tried and how many improved it. A schedule ``within`` its
    relative gap of the bound is left alone: the gap is the model's rounding of the times,
    which the search's windows share (a proved rounded model leaves at most that to gain)."""
    if (
        solver == "cpsat"
        and options.warm_start is not None
        and not _proved(_value(chosen), bound * (1 + within))
        and end - time.perf_counter() > 0.3
        and not _stopped(options)
    ):
        return _improve(chosen, options, end, bound, started)
    return chosen, 0, 0


def _result(
    solver: str,
    searched: tuple[Schedule, int, int],
    options: SolveOptions,
    bound: float,
    backend: BackendResult,
    warm: Warm,
    fluid: FluidBound | None,
    *,
    seconds: float,
) -> SolveResult:
    """The chosen schedule with its solver record: status, objective, bound and gap."""
    chosen, windows, improvements = searched
    value = _value(chosen)
    proved = _proved(value, bound)
    bound = value if proved else min(bound, value)  # rounding noise is no gap
    warm_info = WarmStart(name=warm[0], objective=_value(warm[1])) if warm else None
    extra: dict[str, object] = {
        "warm_start": None if warm_info is None else warm_info.name,
        "warm_start_objective": None if warm_info is None else warm_info.objective,
        "backend_status": backend.status,
        "backend_objective": backend.objective,
        "time_limit": options.time_limit,
        "threads": options.threads,
        "seed": options.seed,
    }
    if windows:
        extra["search"] = {"windows": windows, "improvements": improvements}
    if fluid is not None:
        extra["fluid_bound"] = {"value": fluid.value, "device": fluid.device,
                                "programs": fluid.programs, "seconds": fluid.seconds}  # fmt: skip
    info = SolverInfo(name=solver, status=Status.OPTIMAL if proved else Status.FEASIBLE,
                      objective=value, lower_bound=bound,
                      gap=(value - bound) / value if value > 0 else 0.0, seconds=seconds,
                      extra=extra)  # fmt: skip
    schedule = Schedule(problem=chosen.problem, ops=chosen.ops, solver=info,
                        metrics=chosen.metrics, variant=chosen.variant)  # fmt: skip
    return SolveResult(schedule=schedule, warm_start=warm_info)


class _Reporter:
    """The caller's progress callback, remembering whether it ever raised: a search it
    stopped that way is over for the whole solve (no later phase calls it again)."""

    def __init__(self, progress: ProgressCallback) -> None:
        self.progress = progress
        self.failed = False

    def __call__(self, update: Progress) -> None:
        if self.failed:
            return
        try:
            self.progress(update)
        except BaseException:
            self.failed = True
            raise


def _stopped(options: SolveOptions) -> bool:
    """Whether a stop request or a failing progress callback ended the search already."""
    failed = isinstance(options.progress, _Reporter) and options.progress.failed
    return failed or (options.stop is not None and options.stop.requested is not None)


def _value(schedule: Schedule) -> float:
    return schedule.objective_value(schedule.problem.objective)


def _proved(value: float, bound: float) -> bool:
    """Optimal means the gap to the bound is zero for the problem as given."""
    return value <= bound + 1e-9 * max(1.0, abs(value))


def _fluid(problem: Problem, options: SolveOptions, bound: float, end: float) -> FluidBound | None:
    """The fluid bound (:mod:`pp_opt.solvers.fluid`) within :data:`FLUID_SHARE` of the time
    limit, where it applies and a warm start gives its upper end; None where it found
    nothing above ``bound``."""
    from pp_opt.solvers.fluid import applies

    warm = options.warm_start
    if warm is None or not applies(problem, options.objective) or _stopped(options):
        return None
    if pairs_open(problem):
        return None  # its programs know no overlapped pairs
    upper = _value(warm)
    seconds = min(FLUID_SHARE * options.time_limit, end - time.perf_counter())
    if _proved(upper, bound) or seconds < FLUID_MIN_SECONDS:
        return None
    return fluid_isolated(problem, lower=bound, upper=upper, seconds=seconds, stop=options.stop)


def _skipped() -> BackendResult:
    return BackendResult(status=Status.TIMEOUT, objective=None, bound=None, seconds=0.0, ops=None)


def _run_backend(
    solver: str,
    problem: Problem,
    dag: nx.DiGraph,
    options: SolveOptions,
    end: float,
    *,
    share: float,
) -> BackendResult:
    """The backend with ``share`` of the time left before ``end`` (none: not run)."""
    left = end - time.perf_counter()
    if left <= 0:  # the warm starts used all the time
        return _skipped()
    phase = replace(options, time_limit=max(0.1, share * left))
    return run_isolated(solver, partial(_backend, solver), problem, dag, phase)


def _improve(
    schedule: Schedule,
    options: SolveOptions,
    end: float,
    bound: float,
    started: float,
) -> tuple[Schedule, int, int]:
    """The large-neighbourhood search from ``schedule`` until ``end``, reporting progress;
    also the windows it tried and how many improved the schedule."""
    if end - time.perf_counter() < SEARCH_START_SECONDS_PER_OP * len(schedule.ops):
        log.info("no time left to search %d ops", len(schedule.ops))
        return schedule, 0, 0
    with running_search(options.stop) as search:
        report = guarded(options.progress, search)

        def on_improve(better: Schedule) -> None:
            if report is not None:
                report(Progress(seconds=time.perf_counter() - started, objective=_value(better),
                                bound=bound))  # fmt: skip

        found = improve_isolated(schedule, deadline=end, threads=options.threads,
                                  seed=options.seed, on_improve=on_improve,
                                  search=search)  # fmt: skip
    return found.best, found.windows, found.improvements


def _backend(solver: str) -> Backend:
    """The backend's entry point, imported only now (OR-Tools and PuLP load slowly)."""
    if solver in ("milp", "milp-highs"):
        from pp_opt.solvers.milp import solve_milp

        return partial(solve_milp, backend="highs" if solver == "milp-highs" else "cbc")
    from pp_opt.solvers.cpsat import solve_cpsat

    return solve_cpsat
