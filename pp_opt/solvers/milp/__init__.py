"""The MILP backend (PuLP; CBC by default, HiGHS selectable): the cross-check for CP-SAT.

Same decisions and objective as the CP-SAT model: a start time per op, its order on
each stream, and per activation keep / offload (one of the allowed fractions) /
recompute, under each device's memory cap. The parts, as in the CP-SAT backend:
``variables``, ``constraints``, ``objective``, ``model`` (builds them in a fixed
order), ``solution`` (reads it back), and ``warm`` (initial values); ``backends`` runs
CBC or HiGHS (with a watchdog for CBC). Imported only when it runs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import networkx as nx

from pp_opt.errors import ProblemError
from pp_opt.metrics import compute_metrics
from pp_opt.ops import OpKind
from pp_opt.problem import Problem
from pp_opt.schedule import ScheduledOp, Status
from pp_opt.solvers.base import BackendResult, OutOfTime, Progress, SolveOptions
from pp_opt.solvers.milp.backends import BACKENDS, RunOutcome, RunSettings, run_backend
from pp_opt.solvers.milp.model import build_model
from pp_opt.solvers.milp.solution import read_ops
from pp_opt.solvers.milp.variables import MilpModel
from pp_opt.solvers.milp.warm import apply_warm_start, warm_ops, warm_values
from pp_opt.solvers.process.stop import Search, guarded, running_search

__all__ = ["BACKENDS", "solve_milp"]

log = logging.getLogger(__name__)


def solve_milp(
    problem: Problem,
    dag: nx.DiGraph,
    options: SolveOptions,
    *,
    backend: str = "cbc",
    symmetry: bool = True,
) -> BackendResult:
    """Solve the schedule of ``dag`` as a MILP: the cross-check of the CP-SAT model.

    Parameters
    ----------
    problem
        Costs, caps and switches; ``dag`` must be ``build_dag(problem)`` (or a
        variant of it, e.g. with a fused backward): it is the only dependency source.
    dag
        The ops to schedule and their edges with latencies.
    options
        Time limit (covers building the model too), seed, objective, warm start,
        progress callback and offload fractions. ``threads`` applies to HiGHS;
        CBC runs on one thread so that the same seed gives the same schedule.
    backend
        ``"cbc"`` (PuLP's bundled CBC) or ``"highs"`` (highspy). HiGHS proves
        optimality much sooner on most instances we measured.
    symmetry
        False drops the microbatch-order symmetry breaking (to check that it
        loses no optimum).

    Returns
    -------
    BackendResult
        Status ``optimal``, ``feasible``, ``infeasible`` or ``timeout``, the
        objective of the returned ops, the solver's best bound (None when the
        solver gave none) and the seconds used. Never worse than
        ``options.warm_start``: when the MILP's incumbent is worse or missing,
        the warm start's ops come back with status ``feasible``.
    """
    if backend not in BACKENDS:
        raise ProblemError("backend", f"unknown {backend!r}; use one of {', '.join(BACKENDS)}")
    with running_search(options.stop) as search:
        report = guarded(options.progress, search)
        return _solve(problem, dag, replace(options, progress=report), backend, symmetry, search)


def _solve(
    problem: Problem,
    dag: nx.DiGraph,
    options: SolveOptions,
    backend: str,
    symmetry: bool,
    search: Search,
) -> BackendResult:
    started = time.monotonic()
    deadline = time.perf_counter() + options.time_limit
    warm = warm_ops(problem, dag, options.warm_start) if options.warm_start else None
    warm_value = _objective(problem, warm, options.objective) if warm else None
    _report(options, started, warm_value, None)
    relaxed = _relaxation(problem, options, warm_value, search)
    if warm and warm_value is not None and relaxed is not None and warm_value <= relaxed + 1e-9:
        seconds = time.monotonic() - started  # the warm start is optimal
        _report(options, started, warm_value, warm_value)
        return BackendResult(status=Status.OPTIMAL, objective=warm_value, bound=warm_value,
                             seconds=seconds, ops=warm)  # fmt: skip
    try:
        model: MilpModel | None = build_model(
            problem,
            dag,
            objective_name=options.objective,
            horizon=_horizon(problem, dag, options, warm_value),
            fractions=tuple(options.offload_fractions),
            objective_bound=warm_value,
            symmetry=symmetry,
            deadline=deadline,
        )
    except OutOfTime:
        log.info("milp: no time left to search after building part of the model")
        model = None
    values = warm_values(model, warm) if warm and model else None
    if model is not None and values is not None:
        apply_warm_start(model, values)
    settings = RunSettings(options=options, mip_start=values is not None, started=started,
                           search=search)  # fmt: skip
    out_of_time = time.monotonic() - started >= options.time_limit
    if model is None or model.infeasible or out_of_time or search.stopped:
        # No time left after building (part of) the model, or a cap that precedences
        # alone break.
        infeasible = model is not None and model.infeasible
        outcome = RunOutcome(proved_optimal=False, proved_infeasible=infeasible,
                             has_solution=False, bound=None)  # fmt: skip
    else:
        outcome = run_backend(model.lp, backend, settings)
    found = read_ops(model) if model is not None and outcome.has_solution else None
    value = _objective(problem, found, options.objective) if found else None
    status = Status.OPTIMAL if outcome.proved_optimal and found else Status.FEASIBLE
    if warm and warm_value is not None and (value is None or value > warm_value + 1e-9):
        found, value, status = warm, warm_value, Status.FEASIBLE
    if found is None:
        status = Status.INFEASIBLE if outcome.proved_infeasible else Status.TIMEOUT
    bound = outcome.bound if status is not Status.OPTIMAL else value
    if relaxed is not None:
        bound = relaxed if bound is None else max(bound, relaxed)
    if bound is not None and value is not None:
        bound = min(bound, value)
        if value <= bound + 1e-9 * max(1.0, value):
            status = Status.OPTIMAL
    seconds = time.monotonic() - started
    _report(options, started, value, bound)
    log.info("milp (%s): %s, objective %s, bound %s, %.2f s", backend, status, value, bound,
             seconds)  # fmt: skip
    return BackendResult(status=status, objective=value, bound=bound, seconds=seconds, ops=found)


def _relaxation(
    problem: Problem, options: SolveOptions, upper: float | None, search: Search
) -> float | None:
    """The device relaxation bound (:mod:`pp_opt.solvers.cpsat.relaxation`, solved with
    CP-SAT) within :data:`~pp_opt.solvers.cpsat.RELAXATION_SHARE` of the time limit."""
    from pp_opt.solvers.cpsat import RELAXATION_SHARE
    from pp_opt.solvers.cpsat.relaxation import device_relaxation_bound

    relaxed = device_relaxation_bound(problem, options.objective, upper=upper,
                                      time_limit=RELAXATION_SHARE * options.time_limit,
                                      threads=max(1, options.threads), seed=options.seed,
                                      search=search)  # fmt: skip
    return None if relaxed is None else relaxed.value


def _horizon(
    problem: Problem, dag: nx.DiGraph, options: SolveOptions, warm_value: float | None
) -> float:
    """Latest time any op of some optimal schedule needs (each big-M derives from it).

    Without a warm start: every op one after another (a schedule that holds one
    microbatch at a time fits any cap that admits a schedule). For ``span``, an
    optimum can be shifted per device until no gap between device windows exceeds
    ``t_comm``, so its makespan is at most ``p`` spans plus ``(p-1) t_comm``.
    """
    most = max(options.offload_fractions, default=1.0)
    serial = 0.0
    for key, data in dag.nodes(data=True):
        scale = most if key.kind in (OpKind.OFFLOAD, OpKind.RELOAD) else 1.0
        latency = max((d["latency"] for _, _, d in dag.in_edges(key, data=True)), default=0.0)
        serial += scale * data["duration"] + latency
    if options.objective == "makespan":
        return min(serial, warm_value) if warm_value is not None else serial
    best = min(serial, warm_value) if warm_value is not None else serial
    return problem.p * best + (problem.p - 1) * problem.t_comm


def _objective(problem: Problem, ops: tuple[ScheduledOp, ...], objective: str) -> float:
    metrics = compute_metrics(problem, ops)
    return metrics.makespan if objective == "makespan" else max(metrics.span)


def _report(
    options: SolveOptions, started: float, objective: float | None, bound: float | None
) -> None:
    if options.progress is not None:
        options.progress(Progress(time.monotonic() - started, objective, bound))
