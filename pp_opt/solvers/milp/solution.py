"""Reading a solved model back as timed ops, with the solver's round-off taken out."""

from __future__ import annotations

from dataclasses import replace

import networkx as nx

from pp_opt.ops import ALLOCATING, FREEING, OpKey, OpKind, Stream, duration, pair_time, stream_of
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
    chosen = {f: b for (f, b), (x, _) in v.pairs.items() if (x.varValue or 0.0) > 0.5}
    for f, b in chosen.items():  # a pair, under its F key (its backward half is aliased)
        start = max(0.0, float(v.ops[f].start.varValue or 0.0))
        end = start + pair_time(problem, f.stage, b.stage, b.kind)
        timed[f] = ScheduledOp(OpKind.FB, f.stage, f.microbatch, Stream.COMPUTE, start, end,
                               partner=b)  # fmt: skip
    halves = set(chosen) | set(chosen.values())
    for key, op in v.ops.items():
        if key in halves:
            continue
        fraction = 1.0
        if key.kind in (OpKind.OFFLOAD, OpKind.RELOAD):
            act = (key.stage, key.microbatch)
            moved = [f for f, z in v.offload[act] if (z.varValue or 0.0) > 0.5]
            if not moved:
                continue
            fraction = moved[0]
        elif key.kind is OpKind.R and (v.recompute[key.stage, key.microbatch].varValue or 0) < 0.5:
            continue
        start = max(0.0, float(op.start.varValue or 0.0))
        end = start + duration(problem, key.kind, key.stage, fraction)
        timed[key] = ScheduledOp(key.kind, key.stage, key.microbatch, stream_of(key.kind),
                                 start, end, fraction)  # fmt: skip
    repaired = _push_later(model, timed, {b: f for f, b in chosen.items()})
    return tuple(sorted(repaired.values(), key=lambda o: (o.start, o.stage, o.microbatch)))


def _push_later(
    model: MilpModel, timed: dict[OpKey, ScheduledOp], alias: dict[OpKey, OpKey]
) -> dict[OpKey, ScheduledOp]:
    tol = 1e-6 * max(1.0, model.horizon)
    waits = _waits(model, timed, tol, alias)
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
        fixed[key] = replace(op, start=start, end=start + op.duration)
    return fixed


def _waits(
    model: MilpModel, timed: dict[OpKey, ScheduledOp], tol: float, alias: dict[OpKey, OpKey]
) -> nx.DiGraph:
    """What each present op waits for: ``u -> w`` means ``w`` starts after ``u`` ends (a
    pair is its F key: what either half waits for, and what waits for either half)."""
    ops = model.vars.ops
    waits = nx.DiGraph()
    waits.add_nodes_from(timed)
    for u, w, data in model.dag.edges(data=True):
        u, w = alias.get(u, u), alias.get(w, w)
        if u in timed and w in timed and u != w:
            waits.add_edge(u, w, latency=data["latency"])
    by_resource: dict[object, list[tuple[float, float, OpKey]]] = {}
    for key, op in timed.items():
        by_resource.setdefault(ops[key].resource, []).append((op.start, op.end, key))
    for row in by_resource.values():
        row.sort()
        for (*_, first), (*_, then) in zip(row, row[1:], strict=False):
            if not waits.has_edge(first, then):
                waits.add_edge(first, then, latency=0.0)
    for ek, e in timed.items():
        if e.kind not in FREEING and e.partner is None:
            continue
        for ak, a in timed.items():
            same_device = ops[ak].device == ops[ek].device
            counted = (a.kind in ALLOCATING or a.partner) and e.end <= a.start + tol
            if same_device and counted and ek != ak and not waits.has_edge(ek, ak):
                waits.add_edge(ek, ak, latency=0.0)
    return waits
