"""Reading a CP-SAT solution back as timed ops (in problem units; the API re-times them)."""

from __future__ import annotations

from ortools.sat.python import cp_model

from pp_opt.schedule import ScheduledOp, Status
from pp_opt.solvers.cpsat.pairs import read_pairs
from pp_opt.solvers.cpsat.variables import Variables

STATUS = {
    cp_model.OPTIMAL: Status.OPTIMAL,
    cp_model.FEASIBLE: Status.FEASIBLE,
    cp_model.INFEASIBLE: Status.INFEASIBLE,
    cp_model.UNKNOWN: Status.TIMEOUT,
}
"""CP-SAT's statuses as ours (others mean the model itself was rejected)."""


def read_ops(solver: cp_model.CpSolver, v: Variables) -> tuple[ScheduledOp, ...]:
    """Every present op at its solved start; times divided back into problem units."""
    ops = read_pairs(solver, v, v.scaling.time)
    for op in v.all_op_vars():
        if op.present is not None and not solver.boolean_value(op.present):
            continue
        if op.key in v.alone and not solver.boolean_value(v.alone[op.key]):
            continue  # a half of a pair: listed as the pair
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
