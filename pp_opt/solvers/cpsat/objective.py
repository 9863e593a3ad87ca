"""The CP-SAT objective: makespan or the largest per-device span (docs/design.md §4)."""

from __future__ import annotations

import math
from collections import defaultdict

import networkx as nx
from ortools.sat.python import cp_model

from pp_opt.bounds import lower_bound
from pp_opt.dag import longest_paths
from pp_opt.ops import OpKind
from pp_opt.solvers.cpsat.variables import OpVar, Variables


def add_objective(
    model: cp_model.CpModel,
    v: Variables,
    objective: str,
    *,
    upper: int | None = None,
    lower: int | None = None,
) -> cp_model.IntVar:
    """Minimise ``objective``; ``upper`` (a warm start's value) bounds it from above and
    ``lower`` (a proved bound in model units) from below.

    Every op waits, through the DAG, for a forward of its own device and is
    waited for by a ``W`` (or ``BW``) of its own device, so the first start on a
    device is that of a forward and the last end that of a ``W``/``BW``: bounding
    those is enough. Starts are at least 0, and shifting a schedule to start at 0
    never hurts, so the makespan is the latest end.
    """
    top = v.horizon if upper is None else min(upper, v.horizon)
    obj = model.new_int_var(0, top, objective)
    last_kinds = (OpKind.W, OpKind.BW)
    firsts: dict[int, list[OpVar]] = defaultdict(list)
    lasts: dict[int, list[OpVar]] = defaultdict(list)
    for op in v.ops.values():
        if op.key.kind is OpKind.F:
            firsts[op.device].append(op)
        elif op.key.kind in last_kinds:
            lasts[op.device].append(op)
    for device in sorted(lasts):
        first = model.new_int_var(0, v.horizon, f"first_{device}")
        last = model.new_int_var(0, v.horizon, f"last_{device}")
        for op in lasts[device]:
            model.add(last >= op.end)
        if objective == "makespan":
            model.add(obj >= last)
            model.add(first == 0)
        else:
            for op in firsts[device]:
                model.add(first <= op.start)
            model.add(obj >= last - first)
        v.span_vars[device] = (first, last)
    # The independent bound, on the model's own rounded costs, is valid for the model and
    # lets CP-SAT prove optimality where its own relaxation is weak (spans, mostly).
    model.add(obj >= math.ceil(lower_bound(v.scaled, objective) - 1e-6))
    if lower is not None:
        model.add(obj >= min(lower, top))
    model.minimize(obj)
    return obj


def add_heads_and_tails(
    model: cp_model.CpModel, v: Variables, dag: nx.DiGraph, obj: cp_model.IntVar
) -> None:
    """``start >= head`` and ``makespan >= end + tail`` for every op every schedule has.

    ``head`` is the op's longest DAG path from the sources and ``tail`` its longest path to
    the sinks (model durations and latencies, through ops every schedule has), so both hold
    in every schedule of the model. They are implied by the precedences, but stated per op
    they put the critical paths into CP-SAT's linear relaxation, which is what its bound on
    tight-memory problems is made of (one device's order decides, the others add paths).
    ``dag`` may hold further orders every schedule of the model keeps (edges of latency 0:
    the symmetry breaking, :mod:`.memory_order`); their paths hold as well.
    """
    required = {k: op for k, op in v.ops.items() if op.present is None}
    lat = {(a, b): v.scaling.t(x) for a, b, x in dag.edges(data="latency")}
    head, tail = longest_paths(dag, {k: op.size for k, op in required.items()}, lat)
    for k, op in required.items():
        if head[k] > 0:
            model.add(op.start >= head[k])
        model.add(obj >= op.end + tail[k])
