"""The CP-SAT backend (OR-Tools): variables, constraints, objective, model, solution.

:func:`solve_cpsat` builds the model (:mod:`.model`), solves it and reads the ops back
(:mod:`.solution`). Imported only when it runs: OR-Tools loads slowly.
"""

from __future__ import annotations

import logging
import time

import networkx as nx
from ortools.sat.python import cp_model

from pp_opt.problem import Problem
from pp_opt.schedule import Status
from pp_opt.solvers.base import BackendResult, OutOfTime, Progress, SolveOptions
from pp_opt.solvers.cpsat.model import build_model
from pp_opt.solvers.cpsat.solution import STATUS, read_ops

__all__ = ["solve_cpsat"]

log = logging.getLogger(__name__)


def solve_cpsat(problem: Problem, dag: nx.DiGraph, options: SolveOptions) -> BackendResult:
    """Solve ``problem`` over ``dag`` with OR-Tools CP-SAT.

    Times are integers in the units of :func:`~.scaling.choose_scaling`; the ops
    returned carry those rounded times divided back, and the API re-times their
    order with the exact durations. The search is deterministic for a given seed
    and thread count (``interleave_search``) unless the time limit cuts it short.
    """
    started = time.perf_counter()
    try:
        built = build_model(problem, dag, options, deadline=started + options.time_limit)
    except OutOfTime:
        seconds = time.perf_counter() - started
        log.info("cpsat: no time left to search after %.2f s of building the model", seconds)
        return BackendResult(
            status=Status.TIMEOUT, objective=None, bound=None, seconds=seconds, ops=None
        )
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.max_time_in_seconds = max(0.01, options.time_limit - (time.perf_counter() - started))
    params.num_workers = max(1, options.threads)
    params.random_seed = options.seed
    params.interleave_search = options.threads > 1
    callback = _ProgressCallback(options, built.scaling.time, started, built.objective)
    code = solver.solve(built.model, callback)
    seconds = time.perf_counter() - started
    status = STATUS.get(code)
    if status is None:
        raise RuntimeError(f"CP-SAT rejected the model: {solver.status_name(code)}")
    log.info("cpsat %s in %.2f s (%s)", status, seconds, solver.response_stats().splitlines()[0])
    if status in ("infeasible", "timeout"):
        return BackendResult(status=status, objective=None, bound=None, seconds=seconds, ops=None)
    scale = built.scaling.time
    return BackendResult(
        status=status,
        objective=solver.value(built.objective) / scale,
        # Rounded costs or memory make the model's bound a bound of another problem.
        bound=solver.best_objective_bound / scale if built.scaling.exact else None,
        seconds=seconds,
        ops=read_ops(solver, built.vars),
    )


class _ProgressCallback(cp_model.CpSolverSolutionCallback):
    def __init__(
        self,
        options: SolveOptions,
        scale: float,
        started: float,
        obj: cp_model.IntVar,
    ) -> None:
        super().__init__()
        self._obj = obj
        self._report = options.progress
        self._scale = scale
        self._started = started

    def on_solution_callback(self) -> None:
        if self._report is not None:
            self._report(
                Progress(
                    seconds=time.perf_counter() - self._started,
                    objective=self.value(self._obj) / self._scale,
                    bound=self.best_objective_bound / self._scale,
                )
            )
