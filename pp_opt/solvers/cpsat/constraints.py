"""CP-SAT constraint families, one function each; :mod:`.model` calls them in a fixed order."""

from __future__ import annotations

from collections import defaultdict

import networkx as nx
from ortools.sat.python import cp_model

from pp_opt.ops import OpKey, OpKind, Resource, Stream, memory_delta, resource_of
from pp_opt.runtime_rules import loss_stage, runtime_chains
from pp_opt.solvers.cpsat.exchange import exchange_pairs
from pp_opt.solvers.cpsat.variables import OpRef, OpVar, Variables
from pp_opt.solvers.lifetimes import match_lifetimes


def add_choices(model: cp_model.CpModel, v: Variables) -> None:
    """Each activation is kept, offloaded at one fraction, or recomputed: exactly one."""
    for (s, j), keep in v.keep.items():
        options = [keep] + [c.literal for c in v.offloads.get((s, j), [])]
        r = v.ops.get(OpKey(OpKind.R, s, j))
        if r is not None and r.present is not None:
            options.append(r.present)
        model.add_exactly_one(options)


def _enforce(ct: cp_model.Constraint, *ops: OpVar) -> None:
    literals = [op.present for op in ops if op.present is not None]
    if literals:
        ct.only_enforce_if(literals)


def add_precedences(model: cp_model.CpModel, v: Variables, dag: nx.DiGraph) -> None:
    """Every DAG edge: the successor starts after the predecessor ends plus the latency."""
    for u, w, latency in dag.edges(data="latency"):
        lat = v.scaling.t(latency)
        for a in v.vars_of(u):
            for b in v.vars_of(w):
                if a.present is not None and b.present is not None and a.present is not b.present:
                    continue  # copies of two different offload fractions never coexist
                _enforce(model.add(a.end + lat <= b.start), a, b)


def add_no_overlap(model: cp_model.CpModel, v: Variables) -> None:
    """One op at a time per (device, stream); devices sharing a host link share its copies."""
    groups: dict[Resource, list[cp_model.IntervalVar]] = defaultdict(list)
    for op in v.all_op_vars():
        groups[resource_of(v.problem, op.device, op.stream)].append(op.interval)
    for pair in v.pairs:  # an overlapped pair holds its device's compute stream once
        groups[resource_of(v.problem, pair.forward.device, Stream.COMPUTE)].append(pair.interval)
    for intervals in groups.values():
        if len(intervals) > 1:
            model.add_no_overlap(intervals)


def memory_uses(
    v: Variables, s: int, j: int
) -> list[tuple[OpRef, OpRef, float, cp_model.IntVar | None]]:
    """``(alloc, free, amount, literal)`` lifetimes of one activation, for each choice.

    ``alloc`` and ``free`` are ``(op, at_end)`` references to op variables.
    """
    p = v.problem
    f = v.ops[OpKey(OpKind.F, s, j)]
    split = OpKey(OpKind.W, s, j) in v.ops
    back = v.ops[OpKey(OpKind.B if split else OpKind.BW, s, j)]
    ends = [((back, True), -memory_delta(p, back.key.kind, s)[1])]
    if split:
        ends.append(((v.ops[OpKey(OpKind.W, s, j)], True), -memory_delta(p, OpKind.W, s)[1]))
    keep = v.keep.get((s, j))
    uses = []
    alloc_f = ((f, False), memory_delta(p, OpKind.F, s)[0])
    for start, end, amount in match_lifetimes([alloc_f], ends):
        uses.append((start, end, amount, keep))
    for c in v.offloads.get((s, j), []):
        out = ((c.offload, True), -memory_delta(p, OpKind.OFFLOAD, s, fraction=c.fraction)[1])
        back_in = ((c.reload, False), memory_delta(p, OpKind.RELOAD, s, fraction=c.fraction)[0])
        for start, end, amount in match_lifetimes([alloc_f, back_in], [out, *ends]):
            uses.append((start, end, amount, c.literal))
    r = v.ops.get(OpKey(OpKind.R, s, j))
    if r is not None:
        allocs = [
            ((f, False), memory_delta(p, OpKind.F, s, recomputed=True)[0]),
            ((r, False), memory_delta(p, OpKind.R, s)[0]),
        ]
        for start, end, amount in match_lifetimes(allocs, ends):
            uses.append((start, end, amount, r.present))
    return uses


def _at(ref: tuple[OpVar, bool]) -> cp_model.LinearExprT:
    op, at_end = ref
    return op.end if at_end else op.start


def add_memory(model: cp_model.CpModel, v: Variables) -> None:
    """Activation memory under ``cap - static`` on every device (a cumulative of lifetimes).

    Lifetimes are half-open ``[alloc, free)``, so a free and an allocation at the
    same time do not overlap, as in :func:`pp_opt.metrics.memory_events`.
    """
    per_device: dict[int, tuple[list[cp_model.IntervalVar], list[int]]] = defaultdict(
        lambda: ([], [])
    )
    for s in range(v.problem.num_stages):
        device = v.problem.device_of(s)
        for j in range(v.problem.m):
            for n, (alloc, free, amount, lit) in enumerate(memory_uses(v, s, j)):
                demand = v.scaling.mem(amount)
                if demand <= 0:
                    continue
                size = model.new_int_var(0, v.horizon, f"ms_{s}_{j}_{n}")
                name = f"mem_{s}_{j}_{n}"
                if lit is None:
                    interval = model.new_interval_var(_at(alloc), size, _at(free), name)
                else:
                    interval = model.new_optional_interval_var(
                        _at(alloc), size, _at(free), lit, name
                    )
                v.lifetimes.append((size, alloc, free))
                per_device[device][0].append(interval)
                per_device[device][1].append(demand)
    for device, (intervals, demands) in per_device.items():
        capacity = v.scaling.cap(v.problem.activation_room(device))
        model.add_cumulative(intervals, demands, capacity)


def add_runtime_order(model: cp_model.CpModel, v: Variables) -> None:
    """The runtimes' order rules (:func:`pp_opt.runtime_rules.runtime_chains`)."""
    for a, b in runtime_chains(v.problem):
        first, then = v.ops.get(a), v.ops.get(b)
        if first is not None and then is not None:
            model.add(first.end <= then.start)


def add_symmetry_breaking(model: cp_model.CpModel, v: Variables) -> None:
    """Microbatches in order, where that loses no optimum.

    Microbatches are interchangeable, so renumbering them by the start of their
    forward on any one stage keeps every schedule valid: ``F(S-1, j)`` before
    ``F(S-1, j + 1)`` on the last stage is always safe (it is also what the runtimes
    need, :mod:`pp_opt.runtime_rules`). Without offload and recompute every activation
    of a stage has the same costs and the same memory events, so each op kind can be
    renumbered on each stage by its own order: the k-th ``F`` on stage ``s`` starts
    after k forwards of stage ``s - 1`` ended (each waits for its own), so after
    the k-th of them; likewise for backwards (from stage ``s + 1``, or the
    forwards on the last stage) and for ``W`` after ``B``. Memory only counts how
    many forwards started and backwards ended, which renumbering keeps. With
    offload or recompute, activations differ in their choice, so only the
    last stage's forwards are ordered (one renumbering, the runtimes' own).
    Without them, ops of one device that can trade slots keep the orders of
    :mod:`.exchange` as well (the loss stage's backward before its next forward, the
    turns of a ``v`` placement).
    """
    for a, b in symmetry_chains(v):
        model.add(v.ops[a].end <= v.ops[b].start)


def symmetry_chains(v: Variables) -> list[tuple[OpKey, OpKey]]:
    """The pairs ``(a, b)`` :func:`add_symmetry_breaking` orders (``a`` ends before ``b``)."""
    p = v.problem
    stages: range = range(p.num_stages)
    kinds = [OpKind.F, OpKind.B, OpKind.W, OpKind.BW]
    if v.offloads or any(k.kind is OpKind.R for k in v.ops):
        stages, kinds = range(loss_stage(p), loss_stage(p) + 1), [OpKind.F]
    pairs = []
    for s in stages:
        for kind in kinds:
            chain = [OpKey(kind, s, j) for j in range(p.m)]
            for a, b in zip(chain, chain[1:], strict=False):
                if a in v.ops and b in v.ops:
                    pairs.append((a, b))
    if len(kinds) > 1 and not v.pairs:  # every stage's microbatches in order: the slot
        # exchanges hold too (their swaps assume ops that run alone)
        split = any(k.kind is OpKind.B for k in v.ops)
        pairs += exchange_pairs(p, v.ops, split=split)
    return pairs
