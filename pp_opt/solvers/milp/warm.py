"""Warm starts: a known schedule as initial values of every MILP variable."""

from __future__ import annotations

import logging
from dataclasses import replace

import networkx as nx

from pp_opt.ops import OpKey, OpKind, Stream
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, ScheduledOp, dag_ops
from pp_opt.solvers.milp.variables import MilpModel, WarmValues

log = logging.getLogger(__name__)


def warm_ops(
    problem: Problem, dag: nx.DiGraph, schedule: Schedule
) -> tuple[ScheduledOp, ...] | None:
    """The warm start's ops in the DAG's terms, shifted to start at 0; None if it cannot be.

    A fused ``BW`` becomes ``B`` then ``W`` back to back when the DAG splits the
    backward and ``t_b + t_w`` fits in ``BW``'s time: ``B`` frees part of the
    memory earlier and ``W`` the rest no later, so the schedule stays valid.
    """
    ops = list(schedule.ops)
    if not ops:
        return None
    if dag.graph["split_backward"]:
        ops = [piece for op in ops for piece in _split(problem, op)]
        if any(op.kind is OpKind.BW for op in ops):
            return None
    shift = min(op.start for op in ops)
    ops = [replace(op, start=op.start - shift, end=op.end - shift) for op in ops]
    halves = dag_ops(ops)  # a pair's halves are the DAG's ops
    keys = {op.key for op in halves}
    if len(keys) != len(halves) or any(k not in dag for k in keys):
        log.info("warm start does not match this problem's ops; solving without it")
        return None
    missing = [k for k, data in dag.nodes(data=True) if not data["optional"] and k not in keys]
    if missing:
        log.info("warm start lacks %s; solving without it", missing[0])
        return None
    return tuple(ops)


def _split(problem: Problem, op: ScheduledOp) -> list[ScheduledOp]:
    if op.kind is not OpKind.BW:
        return [op]
    st = problem.stages[op.stage]
    if st.t_b + st.t_w > op.end - op.start + 1e-9:
        return [op]
    mid = op.start + st.t_b
    return [
        ScheduledOp(OpKind.B, op.stage, op.microbatch, Stream.COMPUTE, op.start, mid),
        ScheduledOp(OpKind.W, op.stage, op.microbatch, Stream.COMPUTE, mid, mid + st.t_w),
    ]


def warm_values(model: MilpModel, ops: tuple[ScheduledOp, ...]) -> WarmValues | None:
    """Times of every op of the model (absent optional ops at their earliest, taking no time)."""
    pairs = {(op.order_key, op.partner) for op in ops if op.partner is not None}
    ops = tuple(dag_ops(ops))  # a pair's halves at the pair's times
    start = {op.key: op.start for op in ops}
    end = {op.key: op.end for op in ops}
    fraction = {(op.stage, op.microbatch): op.fraction for op in ops if op.kind is OpKind.OFFLOAD}
    if any(all(abs(f - g) > 1e-9 for g in model.fractions) for f in fraction.values()):
        log.info("warm start offloads a fraction the model does not offer; solving without it")
        return None
    for key in nx.topological_sort(model.dag):
        if key not in start:
            preds = model.dag.pred[key]
            start[key] = end[key] = max(end[u] + preds[u]["latency"] for u in preds)
    p = model.problem.p
    first, last = [float("inf")] * p, [0.0] * p
    for op in ops:
        d = model.problem.device_of(op.stage)
        first[d], last[d] = min(first[d], op.start), max(last[d], op.end)
    first = [0.0 if f == float("inf") else f for f in first]
    recomputed = {(op.stage, op.microbatch) for op in ops if op.kind is OpKind.R}
    present: set[OpKey] = {op.key for op in ops}
    return WarmValues(start=start, end=end, present=present, fraction=fraction,
                      recomputed=recomputed, first=first, last=last, pairs=pairs)  # fmt: skip


def apply_warm_start(model: MilpModel, warm: WarmValues) -> None:
    """Set every variable's initial value (binaries first-created first, products last)."""
    values: dict[str, float] = {}
    for var, hint in model.vars.hints:
        value = hint(warm, values)
        values[var.name] = value
        var.setInitialValue(value)
