"""Reading a solved model back as timed ops, with the solver's round-off taken out."""

from __future__ import annotations

import networkx as nx

from pp_opt.ops import ALLOCATING, FREEING, OpKey, OpKind, duration, stream_of
from pp_opt.schedule import ScheduledOp
from pp_opt.solvers.milp.variables import MilpModel


def read_ops(model: MilpModel) -> tuple[ScheduledOp, ...]:
    """The present ops at their solved starts, ends from the cost rules (not the LP).

    MILP solvers meet constraints within a tolerance (about 1e-6), so an op may
    start a hair before its predecessor ends. Each start is pushed later to the
    exact end it waits for (DAG edges, the op before it on its stream, and the
    frees the memory check counted), which only removes that round-off.
    """
    problem, v = model.problem, model.vars
    timed: dict[OpKey, ScheduledOp] = {}
    for key, op in v.ops.items():
        fraction = 1.0
        if key.kind in (OpKind.OFFLOAD, OpKind.RELOAD):
            act = (key.stage, key.microbatch)
            chosen = [f for f, z in v.offload[act] if (z.varValue or 0.0) > 0.5]
            if not chosen:
                continue
            fraction = chosen[0]
        elif key.kind is OpKind.R and (v.recompute[key.stage, key.microbatch].varValue or 0) < 0.5:
            continue
        start = max(0.0, float(op.start.varValue or 0.0))
        end = start + duration(problem, key.kind, key.stage, fraction)
        timed[key] = ScheduledOp(key.kind, key.stage, key.microbatch, stream_of(key.kind),
                                 start, end, fraction)  # fmt: skip
    repaired = _push_later(model, timed)
    return tuple(sorted(repaired.values(), key=lambda o: (o.start, o.stage, o.microbatch)))


def _push_later(model: MilpModel, timed: dict[OpKey, ScheduledOp]) -> dict[OpKey, ScheduledOp]:
    tol = 1e-6 * max(1.0, model.horizon)
    waits = _waits(model, timed, tol)
    try:
        order = list(nx.lexicographical_topological_sort(waits, key=lambda k: (timed[k].start, k)))
    except nx.NetworkXUnfeasible:
        return timed  # cannot happen for a solution within tolerance; keep it as solved
    fixed: dict[OpKey, ScheduledOp] = {}
    for key in order:
        op = timed[key]
        start = op.start
        for u, _, data in waits.in_edges(key, data=True):
            start = max(start, fixed[u].end + data["latency"])
        fixed[key] = ScheduledOp(op.kind, op.stage, op.microbatch, op.stream, start,
                                 start + op.duration, op.fraction)  # fmt: skip
    return fixed


def _waits(model: MilpModel, timed: dict[OpKey, ScheduledOp], tol: float) -> nx.DiGraph:
    """What each present op waits for: ``u -> w`` means ``w`` starts after ``u`` ends."""
    ops = model.vars.ops
    waits = nx.DiGraph()
    waits.add_nodes_from(timed)
    for u, w, data in model.dag.edges(data=True):
        if u in timed and w in timed:
            waits.add_edge(u, w, latency=data["latency"])
    by_resource: dict[object, list[ScheduledOp]] = {}
    for key, op in timed.items():
        by_resource.setdefault(ops[key].resource, []).append(op)
    for row in by_resource.values():
        row.sort(key=lambda o: (o.start, o.end, o.key))
        for a, b in zip(row, row[1:], strict=False):
            if not waits.has_edge(a.key, b.key):
                waits.add_edge(a.key, b.key, latency=0.0)
    for e in timed.values():
        if e.kind not in FREEING:
            continue
        for a in timed.values():
            same_device = ops[a.key].device == ops[e.key].device
            counted = a.kind in ALLOCATING and e.end <= a.start + tol
            if same_device and counted and not waits.has_edge(e.key, a.key):
                waits.add_edge(e.key, a.key, latency=0.0)
    return waits
