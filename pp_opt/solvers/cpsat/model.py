"""The CP-SAT backend: build the model in a fixed order, hint the warm start, solve, read back."""

from __future__ import annotations

import logging
import time

import networkx as nx
from ortools.sat.python import cp_model

from pp_opt.ops import OpKey, OpKind, Stream
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, ScheduledOp
from pp_opt.simulator import simulate, waits_of
from pp_opt.solvers.base import BackendResult, Progress, SolveOptions
from pp_opt.solvers.cpsat.constraints import (
    add_choices,
    add_memory,
    add_no_overlap,
    add_precedences,
    add_symmetry_breaking,
)
from pp_opt.solvers.cpsat.objective import add_objective
from pp_opt.solvers.cpsat.scaling import choose_scaling
from pp_opt.solvers.cpsat.variables import (
    OpVar,
    Variables,
    create_variables,
    scaled_problem,
    serial_horizon,
)

log = logging.getLogger(__name__)

_STATUS = {
    cp_model.OPTIMAL: "optimal",
    cp_model.FEASIBLE: "feasible",
    cp_model.INFEASIBLE: "infeasible",
    cp_model.UNKNOWN: "timeout",
}


def solve_cpsat(problem: Problem, dag: nx.DiGraph, options: SolveOptions) -> BackendResult:
    """Solve ``problem`` over ``dag`` with OR-Tools CP-SAT.

    Times are integers in the units of :func:`~.scaling.choose_scaling`; the ops
    returned carry those rounded times divided back, and the API re-times their
    order with the exact durations. The search is deterministic for a given seed
    and thread count (``interleave_search``) unless the time limit cuts it short.
    """
    started = time.perf_counter()
    fractions = tuple(options.offload_fractions) if dag.graph.get("offload") else ()
    scaling = choose_scaling(problem, fractions or (1.0,))
    scaled = scaled_problem(problem, scaling)
    horizon = serial_horizon(scaled, dag, fractions or (1.0,))
    warm = _warm_times(options.warm_start, problem, scaled, dag)
    upper = None
    if warm is not None:
        upper = _objective_of(warm, options.objective)
        if options.objective == "makespan":
            horizon = min(horizon, upper)
    model = cp_model.CpModel()
    v = create_variables(model, problem, dag, scaling, horizon=horizon, fractions=fractions)
    # Constraint families, in this order: the choice per activation, the DAG
    # precedences, one op per stream, the memory caps, then symmetry breaking.
    add_choices(model, v)
    add_precedences(model, v, dag)
    add_no_overlap(model, v)
    add_memory(model, v)
    add_symmetry_breaking(model, v)
    obj = add_objective(model, v, options.objective, upper=upper)
    if warm is not None:
        _add_hints(model, v, warm, obj, options.objective)
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.max_time_in_seconds = max(0.01, options.time_limit - (time.perf_counter() - started))
    params.num_workers = max(1, options.threads)
    params.random_seed = options.seed
    params.interleave_search = options.threads > 1
    callback = _ProgressCallback(options, scaling.time, started, obj)
    status = solver.solve(model, callback)
    seconds = time.perf_counter() - started
    name = _STATUS.get(status)
    if name is None:
        raise RuntimeError(f"CP-SAT rejected the model: {solver.status_name(status)}")
    log.info("cpsat %s in %.2f s (%s)", name, seconds, solver.response_stats().splitlines()[0])
    if name in ("infeasible", "timeout"):
        return BackendResult(status=name, objective=None, bound=None, seconds=seconds, ops=None)
    return BackendResult(
        status=name,
        objective=solver.value(obj) / scaling.time,
        # Rounded costs or memory make the model's bound a bound of another problem.
        bound=solver.best_objective_bound / scaling.time if scaling.exact else None,
        seconds=seconds,
        ops=_read_ops(solver, v),
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


def _read_ops(solver: cp_model.CpSolver, v: Variables) -> tuple[ScheduledOp, ...]:
    ops = []
    for op in v.all_op_vars():
        if op.present is not None and not solver.boolean_value(op.present):
            continue
        start = solver.value(op.start)
        ops.append(
            ScheduledOp(
                op.key.kind,
                op.key.stage,
                op.key.microbatch,
                op.stream,
                start / v.scaling.time,
                (start + op.size) / v.scaling.time,
                op.fraction,
            )
        )
    return tuple(ops)


def _warm_times(
    warm: Schedule | None, problem: Problem, scaled: Problem, dag: nx.DiGraph
) -> Schedule | None:
    """The warm start's op order timed in model units, mapped onto the DAG's op kinds."""
    if warm is None:
        return None
    if [s.device for s in warm.problem.stages] != [s.device for s in problem.stages]:
        log.info("warm start ignored: its placement differs from the problem's")
        return None
    split = bool(dag.graph.get("split_backward"))
    order: dict[tuple[int, Stream], list[OpKey]] = {}
    for device in range(problem.p):
        for op in warm.device_ops(device):
            keys = [op.key]
            if split and op.kind is OpKind.BW:
                keys = [
                    OpKey(OpKind.B, op.stage, op.microbatch),
                    OpKey(OpKind.W, op.stage, op.microbatch),
                ]
            elif not split and op.kind in (OpKind.B, OpKind.W):
                keys = [OpKey(OpKind.BW, op.stage, op.microbatch)] if op.kind is OpKind.B else []
            order.setdefault((device, op.stream), []).extend(keys)
    fractions = {op.key: op.fraction for op in warm.ops if op.fraction != 1.0}
    waits = [(u, w) for u, w in waits_of(warm) if u in dag and w in dag]
    try:
        return simulate(scaled, order, fractions=fractions, waits=waits)
    except Exception as err:  # a hint is only a hint: never let it stop the solve
        log.info("warm start ignored: %s", err)
        return None


def _objective_of(schedule: Schedule, objective: str) -> int:
    return int(round(schedule.objective_value(objective)))


def _add_hints(
    model: cp_model.CpModel, v: Variables, warm: Schedule, obj: cp_model.IntVar, objective: str
) -> None:
    """Hint every variable (a complete hint is far more useful to CP-SAT than a partial one)."""
    timed = {op.key: op for op in warm.ops}
    start: dict[int, int] = {}

    def hint_op(op_var: OpVar, value: float) -> None:
        start[id(op_var)] = int(round(value))
        model.add_hint(op_var.start, start[id(op_var)])

    for key, op in v.ops.items():
        if key in timed:
            hint_op(op, timed[key].start)
        if op.present is not None:
            model.add_hint(op.present, key in timed)
    for (s, j), choices in v.offloads.items():
        moved = timed.get(OpKey(OpKind.OFFLOAD, s, j))
        back = timed.get(OpKey(OpKind.RELOAD, s, j))
        chosen = None
        if moved is not None and back is not None:  # both present or neither (simulator)
            chosen = min(choices, key=lambda c: abs(c.fraction - moved.fraction))
        for c in choices:
            model.add_hint(c.literal, c is chosen)
            if c is chosen and moved is not None and back is not None:
                hint_op(c.offload, moved.start)
                hint_op(c.reload, back.start)
    for (s, j), keep in v.keep.items():
        changed = OpKey(OpKind.OFFLOAD, s, j) in timed or OpKey(OpKind.R, s, j) in timed
        model.add_hint(keep, not changed)
    for size, alloc, free in v.lifetimes:
        if id(alloc[0]) in start and id(free[0]) in start:
            a = start[id(alloc[0])] + (alloc[0].size if alloc[1] else 0)
            b = start[id(free[0])] + (free[0].size if free[1] else 0)
            model.add_hint(size, max(0, b - a))
    for device, (first, last) in v.span_vars.items():
        own = warm.device_ops(device)
        model.add_hint(
            first, 0 if objective == "makespan" else int(round(min(op.start for op in own)))
        )
        model.add_hint(last, int(round(max(op.end for op in own))))
    model.add_hint(obj, _objective_of(warm, objective))
