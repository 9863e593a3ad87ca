"""The CP-SAT backend (OR-Tools): variables, constraints, objective, model, solution.

:func:`solve_cpsat` builds the model (:mod:`.model`), solves it and reads the ops back
(:mod:`.solution`). Imported only when it runs: OR-Tools loads slowly.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import replace

import networkx as nx
from ortools.sat.python import cp_model

from pp_opt.bounds import lower_bound
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, ScheduledOp, Status
from pp_opt.solvers.base import (
    BackendResult,
    OutOfTime,
    Progress,
    ProgressCallback,
    SolveOptions,
    pins_copies,
)
from pp_opt.solvers.cpsat.fixed_order import as_schedule, fixed_order_model, promising
from pp_opt.solvers.cpsat.model import CpsatModel, build_model
from pp_opt.solvers.cpsat.pinned import pinned_copies
from pp_opt.solvers.cpsat.relaxation import RelaxationBound, device_relaxation_bound
from pp_opt.solvers.cpsat.scaling import choose_scaling, problem_bound, time_rounding
from pp_opt.solvers.cpsat.solution import STATUS, read_ops
from pp_opt.solvers.process.stop import Search, guarded, handling_signals, running_search

__all__ = ["solve_cpsat"]

log = logging.getLogger(__name__)


def solve_cpsat(problem: Problem, dag: nx.DiGraph, options: SolveOptions) -> BackendResult:
    """Solve ``problem`` over ``dag`` with OR-Tools CP-SAT.

    Times are integers in the units of :func:`~.scaling.choose_scaling`; the ops
    returned carry those rounded times divided back, and the API re-times their
    order with the exact durations. The search is deterministic for a given seed
    and thread count (``interleave_search``) unless the time limit cuts it short.
    A signal (:mod:`pp_opt.solvers.process.stop`) or a progress callback that raises
    ends the search early with its best schedule; the callback's error never
    reaches OR-Tools.
    """
    with running_search(options.stop) as search:
        return _solve(problem, dag, options, search)


def _solve(
    problem: Problem, dag: nx.DiGraph, options: SolveOptions, search: Search
) -> BackendResult:
    started = time.perf_counter()
    relaxed = _relaxation(problem, options, search)
    warm = options.warm_start
    if relaxed is not None and warm is not None:
        value = warm.objective_value(options.objective)
        if value <= relaxed.value + 1e-9 * max(1.0, value):  # the warm start is optimal
            return BackendResult(status=Status.OPTIMAL, objective=value, bound=relaxed.value,
                                 seconds=time.perf_counter() - started, ops=warm.ops)  # fmt: skip
    report = guarded(options.progress, search)
    ordered: Found | None = None
    # Where the greedy copies are weakest: shared host links, placements beyond ``loop``
    # (on ``loop`` without links they keep within a few percent; the time is the model's).
    weak_copies = bool(problem.host_links) or problem.placement != "loop"
    if problem.offload and weak_copies and options.alternatives and warm is not None:
        ordered = _fixed_orders(problem, dag, options, warm, search, report, started)
        if ordered is not None and ordered[3] is not None:  # the full model starts from it
            options = replace(options, warm_start=as_schedule(problem, ordered[3], warm.variant))
    try:
        built = build_model(problem, dag, options, deadline=started + options.time_limit,
                            bound=None if relaxed is None else relaxed.value)  # fmt: skip
    except OutOfTime:
        seconds = time.perf_counter() - started
        log.info("cpsat: no time left to search after %.2f s of building the model", seconds)
        return BackendResult(
            status=Status.TIMEOUT, objective=None, bound=None, seconds=seconds, ops=None
        )
    if search.stopped:  # asked to stop before the search began: the warm start stands
        return BackendResult(status=Status.TIMEOUT, objective=None, bound=None,
                             seconds=time.perf_counter() - started, ops=None)  # fmt: skip
    deadline = started + options.time_limit
    # A model that can prove (memory over the op sequence, exact scale) searches
    # deterministically for a share of the time, then proves its incumbent (_prove).
    proving = built.sequence_memory and built.scaling.exact and options.threads > 1
    share = SEARCH_SHARE if proving else 1.0
    first = _search(
        built,
        options,
        search,
        report,
        started,
        until=started + share * options.time_limit,
        interleave=options.threads > 1,
    )
    if ordered is not None and (first is None or first[3] is None or ordered[1] < first[1]):
        first = (Status.FEASIBLE, ordered[1], None, ordered[3])  # its bound holds for its order
    if first is None and proving and not search.stopped:
        first = _after_empty_share(built, options, search, report, started, deadline)
    if first is None:
        return BackendResult(status=Status.TIMEOUT, objective=None,
                             bound=None if relaxed is None else relaxed.value,
                             seconds=time.perf_counter() - started, ops=None)  # fmt: skip
    status, objective, bound, ops = first
    if status == "infeasible":
        return BackendResult(status=status, objective=None, bound=None,
                             seconds=time.perf_counter() - started, ops=None)  # fmt: skip
    if proving and status != Status.OPTIMAL and not search.stopped:
        status, objective, bound, ops = _prove(
            built, options, search, report, started, deadline, (status, objective, bound, ops)
        )
    scale = built.scaling.time
    if not built.complete:  # a window of the pairs: its optimum and bound are not the problem's
        status, bound = (Status.FEASIBLE if status == Status.OPTIMAL else status), None
    paired = bool(built.vars.pairs)
    held = None if bound is None else problem_bound(problem, built.scaling, options.objective,
                                                    bound, paired=paired)  # fmt: skip
    bounds = [b for b in (held, None if relaxed is None else relaxed.value) if b is not None]
    return BackendResult(status=status, objective=objective / scale,
                         bound=max(bounds) if bounds else None,
                         seconds=time.perf_counter() - started, ops=ops,
                         rounding=time_rounding(problem, built.scaling))  # fmt: skip


def _after_empty_share(
    built: CpsatModel,
    options: SolveOptions,
    search: Search,
    report: ProgressCallback | None,
    started: float,
    deadline: float,
) -> Found | None:
    """The proof's incumbent when the search's share found nothing (the relaxation and the
    model took it, or a loaded machine): the warm start (ops None: the API has it), which
    the proof tries to beat; without one, the proof's workers search, and prove, in the rest
    of the time."""
    if built.upper is not None:
        return Status.FEASIBLE, built.upper, None, None
    log.info("cpsat: nothing found in the search's share; the proof's workers search")
    return _search(built, options, search, report, started, until=deadline, interleave=False,
                   proof=True)  # fmt: skip


FIXED_ORDER_SHARE = 0.3
"""Share of the time an offload solve with other warm starts spends re-placing their copies
with their compute orders fixed (:mod:`.fixed_order`) before the full model."""


def _fixed_orders(
    problem: Problem,
    dag: nx.DiGraph,
    options: SolveOptions,
    warm: Schedule,
    search: Search,
    report: ProgressCallback | None,
    started: float,
) -> Found | None:
    """The best schedule of the fixed-order models of the most promising warm starts
    (:func:`.fixed_order.promising`); the fastest order gets half of the time."""
    until = started + FIXED_ORDER_SHARE * options.time_limit
    tried = promising(problem, [warm, *options.alternatives])
    bound = lower_bound(problem, options.objective, offload_fractions=options.offload_fractions)
    best = _pinned(problem, options, tried, search, report, started, bound) if tried else None
    for n, schedule in enumerate(tried):
        left = until - time.perf_counter()
        if left < 0.5 or search.stopped:
            break
        share = left / 2 if n == 0 and len(tried) > 1 else left / (len(tried) - n)
        try:
            built = fixed_order_model(problem, dag, options, schedule, deadline=until)
        except OutOfTime:
            break
        found = _search(built, options, search, report, started, interleave=options.threads > 1,
                        until=time.perf_counter() + share, shown_bound=bound)  # fmt: skip
        if found is None or found[3] is None:
            continue
        log.info("cpsat: copies for compute order %d of %d: %.6g", n + 1, len(tried),
                 found[1] / built.scaling.time)  # fmt: skip
        if best is None or found[1] < best[1]:
            best = found
    return best


PINNED_SHARE = 0.8
"""Share of the time an offload solve (where :func:`~pp_opt.solvers.base.pins_copies`) may
spend placing the fastest order's copies window by window (:mod:`.pinned`) before the
other fixed-order models and the full model."""


def _pinned(
    problem: Problem,
    options: SolveOptions,
    tried: list[Schedule],
    search: Search,
    report: ProgressCallback | None,
    started: float,
    bound: float,
) -> Found | None:
    """The fastest order's copies placed window by window (:mod:`.pinned`), as a result of
    the full model's units; None where it does not apply or found nothing."""
    # The windows are models of the problem's own DAG: an order of the other backward
    # (a classic schedule's fused BW on a split problem) has no place in them.
    same = [s for s in tried if s.variant.split_backward == problem.split_backward]
    if not same or not pins_copies(problem):
        return None
    until = started + PINNED_SHARE * options.time_limit
    ops = pinned_copies(problem, same[0], options, until=until, search=search)
    if ops is None:
        return None
    scale = choose_scaling(problem, options.offload_fractions).time
    value = max(op.end for op in ops)
    log.info("cpsat: pinned copies for the fastest order: %.6g", value)
    if report is not None:
        report(Progress(seconds=time.perf_counter() - started, objective=value, bound=bound))
    return Status.FEASIBLE, int(round(value * scale)), None, ops


SEARCH_SHARE = 0.1
"""Share of the time a model that can prove (:func:`_prove`) searches with
``interleave_search`` before the proof starts. The proof's portfolio (:data:`PROOF_WORKERS`)
finds better schedules as fast as this search and proves them in the same solve, so the
search gets only what proves small models deterministically: p 4, m 12, cap 2.5 of
``bench_solvers.py --parts exact`` at 60 s was proved in 45.4 s with 0.1 and not with 0.3
(the search had reached 39.7 by its 18 s; the proof found 38.30 at 37 s and had 23 s
left for a refutation of about 35 s)."""

Found = tuple[Status, int, float | None, tuple[ScheduledOp, ...] | None]
"""``(status, objective, bound, ops)`` of one solve, in model units."""


def _search(
    built: CpsatModel,
    options: SolveOptions,
    search: Search,
    report: ProgressCallback | None,
    started: float,
    *,
    until: float,
    interleave: bool,
    shown_bound: float | None = None,
    proof: bool = False,
) -> Found | None:
    """One CP-SAT solve of the built model until ``until``; None when it found nothing and
    proved nothing (timeout). ``shown_bound`` is the bound progress reports show instead of
    the model's (a restricted model's bound is not the problem's); ``proof`` picks the
    portfolio of :data:`PROOF_WORKERS`."""
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.max_time_in_seconds = max(0.01, until - time.perf_counter())
    params.num_workers = max(1, options.threads)
    params.random_seed = options.seed
    # interleave_search stays: it is what makes a multi-threaded search repeatable (the same
    # seed and threads give the same schedule, as the README says); without it CP-SAT's
    # parallel portfolio returns whichever worker's solution came first. Its one known abort
    # (OR-Tools 9.15: ``Check failed: heuristics.fixed_search != nullptr``, SIGABRT) comes
    # with a hint that the model rejects, e.g. a warm start exactly at the printed minimum
    # cap that the model's memory rounding puts just over it: _drop_rejected_hint finds
    # such a hint first (presolve with the hint fixed, milliseconds) and drops it. Any other
    # native abort costs only this backend's answer (pp_opt.solvers.process.isolation).
    params.interleave_search = interleave
    if built.sequence_memory:
        # Memory over the op sequence is linear in the order literals: with them in the LP,
        # the bound moves (p 4, m 8, cap 2.5 of bench_solvers.py --parts exact: proved in
        # 55 s instead of 194 s).
        params.linearization_level = 2
    if proof and params.num_workers <= len(PROOF_WORKERS):
        params.num_full_subsolvers = params.num_workers
        params.subsolvers.extend(PROOF_WORKERS[: params.num_workers])
    if interleave:
        _drop_rejected_hint(built.model, options, started)
    if handling_signals():  # the command line's handler stops the search (and says so)
        params.catch_sigint_signal = False
    callback = _ProgressCallback(report, search, built.scaling.time, started, built.objective,
                                 shown_bound)  # fmt: skip
    solved = threading.Event()
    search.on_stop(lambda: _stop_soon(solver, solved))
    try:
        code = solver.solve(built.model, callback)
    finally:
        solved.set()
    status = STATUS.get(code)
    if status is None:
        raise RuntimeError(f"CP-SAT rejected the model: {solver.status_name(code)}")
    log.info("cpsat %s after %.2f s (%s)", status, time.perf_counter() - started,
             solver.response_stats().splitlines()[0])  # fmt: skip
    if status == "timeout":
        return None
    if status == "infeasible":
        return status, 0, None, None
    bound = solver.best_objective_bound
    return (status, int(solver.value(built.objective)),
            bound if math.isfinite(bound) else None, read_ops(solver, built.vars))  # fmt: skip


def _prove(
    built: CpsatModel,
    options: SolveOptions,
    search: Search,
    report: ProgressCallback | None,
    started: float,
    deadline: float,
    incumbent: Found,
) -> Found:
    """Prove the deterministic search's incumbent optimal, or beat it, by ``deadline``.

    The model is asked for a schedule strictly better than the incumbent, by a parallel
    portfolio (:data:`PROOF_WORKERS`; no ``interleave_search``, no hint): its workers share
    bounds and fixings, which proves tight-memory problems several times faster than the
    interleaved search (p 4, m 8, cap 2.5: 16 s against 55 s). Infeasible proves the
    incumbent, which stays the answer, so a proved result is as repeatable as the search; a
    better schedule found here depends on the threads' timing. Otherwise its bound holds for every
    schedule better than the incumbent, so the smaller of the two is a bound.
    """
    status, value, bound, ops = incumbent
    if deadline - time.perf_counter() < 0.5:
        return incumbent
    built.model.clear_hints()  # type: ignore[no-untyped-call]
    built.model.add(built.objective <= value - 1)
    found = _search(built, options, search, report, started, until=deadline, interleave=False,
                    proof=True)  # fmt: skip
    if found is None:  # nothing better, and not proved: the bound may still have moved
        return incumbent
    if found[0] == "infeasible":
        log.info("cpsat: the incumbent %d is optimal (nothing better exists)", value)
        return Status.OPTIMAL, value, value, ops
    better_status, better, better_bound, better_ops = found
    known = [b for b in (bound, better_bound) if b is not None]
    return better_status, better, max(known, default=None), better_ops


PROOF_WORKERS = ("default_lp", "no_lp", "max_lp")
"""The proof's CP-SAT workers, the first ``threads`` of them, up to three threads; with four
or more, CP-SAT's own portfolio (which has ``no_lp`` from four on). Its own for two
threads is ``default_lp`` and a local search (``fj``) that can refute nothing, and for
three ``default_lp``, ``fixed`` and ``fj``. Without the LP a worker goes through conflicts
several times faster, and on memory-tight problems that is what refutes: p 4, m 12,
cap 2.5 of ``bench_solvers.py --parts exact``, "<= 38.25?" on 2 cores, 34.0 / 35.0 /
40.2 s for seeds 0 / 1 / 2 (the ``no_lp`` worker answers) against 70-77 s with CP-SAT's
portfolio. The LP worker stays beside it for the problems whose proof is the LP bound."""


HINT_CHECK_SHARE = 0.1
"""Share of the backend's time the hint check may take at most (it stops at presolve when
the hint is wrong, and at the first solution when it is right)."""


def _drop_rejected_hint(model: cp_model.CpModel, options: SolveOptions, started: float) -> None:
    """Remove the model's hint when CP-SAT proves no solution extends it.

    CP-SAT with ``interleave_search`` aborts the process on such a hint (see the comment in
    :func:`_solve`); a rejected hint is of no use to the search anyway.
    """
    if not len(model.proto.solution_hint.vars):
        return
    left = options.time_limit - (time.perf_counter() - started)
    check = cp_model.CpSolver()
    check.parameters.num_workers = 1
    check.parameters.random_seed = options.seed
    check.parameters.fix_variables_to_their_hinted_value = True
    check.parameters.stop_after_first_solution = True
    check.parameters.max_time_in_seconds = max(0.01, HINT_CHECK_SHARE * left)
    if handling_signals():
        check.parameters.catch_sigint_signal = False
    if check.solve(model) == cp_model.INFEASIBLE:
        log.info("cpsat: the warm start's hint does not fit the model; solving without it")
        model.clear_hints()  # type: ignore[no-untyped-call]


RELAXATION_SHARE = 0.2
"""Most of a CP-SAT solve's time limit the device relaxation bound
(:mod:`.relaxation`) may use before the full model; it usually needs a few seconds
where it applies (no offload or recompute) and proves tight-memory optima."""


def _relaxation(problem: Problem, options: SolveOptions, search: Search) -> RelaxationBound | None:
    """The device relaxation bound, when it applies (:mod:`.relaxation`)."""
    warm = options.warm_start
    upper = None if warm is None else warm.objective_value(options.objective)
    return device_relaxation_bound(problem, options.objective, upper=upper,
                                   time_limit=RELAXATION_SHARE * options.time_limit,
                                   threads=max(1, options.threads), seed=options.seed,
                                   search=search)  # fmt: skip


STOP_DELAY = 0.25
"""Seconds between a stop request and ``stop_search``. OR-Tools 9.15 aborts the process
(``Check failed: solution->size() == postsolve_mapping.size()``) when the search is stopped
while its first solution is being reported, with ``interleave_search`` and a hint (our
default); stopping a moment later is safe."""


def _stop_soon(solver: cp_model.CpSolver, solved: threading.Event) -> None:
    """Stop the search from another thread after :data:`STOP_DELAY`, again every half
    second until ``solve`` has returned (a stop before the search has started is lost)."""

    def stop() -> None:
        delay = STOP_DELAY
        while not solved.wait(delay):
            solver.stop_search()
            delay = 0.5

    threading.Thread(target=stop, daemon=True).start()


class _ProgressCallback(cp_model.CpSolverSolutionCallback):
    """Reports each incumbent; never lets an exception unwind into OR-Tools."""

    def __init__(
        self,
        report: ProgressCallback | None,
        search: Search,
        scale: float,
        started: float,
        obj: cp_model.IntVar,
        shown_bound: float | None = None,
    ) -> None:
        super().__init__()
        self._shown_bound = shown_bound
        self._obj = obj
        self._report = report
        self._search = search
        self._scale = scale
        self._started = started

    def on_solution_callback(self) -> None:
        try:
            if self._search.stopped:  # stopping: no more reports (the stop is on its way)
                return
            if self._report is not None:
                self._report(
                    Progress(
                        seconds=time.perf_counter() - self._started,
                        objective=self.value(self._obj) / self._scale,
                        bound=self.best_objective_bound / self._scale
                        if self._shown_bound is None
                        else self._shown_bound,
                    )
                )
        except BaseException as err:  # an exception here would abort the process
            log.warning("cpsat solution callback failed: %s", err)
            self._search.stop(f"solution callback failed: {err}")
