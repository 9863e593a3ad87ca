"""Memory over each device's op sequence: precedence literals instead of a cumulative.

Without offload and recompute a device's memory changes only at its compute ops
(``F`` allocates at its start, ``B``, ``W`` and ``BW`` free at their end) and its
compute stream runs one op at a time, so the memory a device holds at any moment
depends only on the *order* of its compute ops, never on their times. It rises only
at the start of a forward, so it is under the cap everywhere iff it is under the cap
at the start of every forward ``x``::

    sum over lifetimes l of d_l * ([alloc_l is x or before x] - [free_l before x]) <= room

where ``before`` means "ends no later than the other starts" (frees at the same
moment as an allocation come first, as in :func:`pp_opt.metrics.memory_events`); a
lifetime's free always follows its allocation in the DAG, so the difference is 1
exactly while it holds memory. With one literal ``a before b`` per pair of compute
ops of a device (fixed where the DAG or the symmetry breaking of
:func:`~.constraints.symmetry_chains` orders the pair), this is linear in literals
and is an exact model of the cap: CP-SAT branches on the order, which decides both
the memory and (with the disjunctive times) the makespan, instead of reasoning
about variable-length memory intervals.

Offload copies move memory at times of other streams, and ``R`` ops are optional;
those models keep the cumulative of :func:`~.constraints.add_memory`.
"""

from __future__ import annotations

from collections import defaultdict

import networkx as nx
from ortools.sat.python import cp_model

from pp_opt.ops import OpKey, OpKind, Stream
from pp_opt.solvers.cpsat.constraints import memory_uses
from pp_opt.solvers.cpsat.memory_order import memory_orders
from pp_opt.solvers.cpsat.variables import Before, OpVar, Variables
from pp_opt.solvers.cpsat.w_order import add_w_order, implied_w_orders, w_class

__all__ = [
    "SEQUENCE_MAX_DEVICE_OPS",
    "add_memory_orders",
    "add_order_steps",
    "add_sequence_memory",
    "uses_sequence_memory",
]

SEQUENCE_MAX_DEVICE_OPS = 100
"""Largest number of compute ops on one device for which the memory is modelled over
the op sequence (one literal per pair: about 5,000 per device here); above it the
cumulative of lifetimes is used. On the 1.5B ``v`` rows of ``bench_solvers.py --parts
tight`` (144 per device) the pairs cost the full model's short share more than they
gave (1538.75 against 1487.20 on V-Min's cap, 60 s)."""

_COMPUTE = (OpKind.F, OpKind.B, OpKind.W, OpKind.BW)


def uses_sequence_memory(v: Variables) -> bool:
    """Whether :func:`add_sequence_memory` applies: no copies, no optional ops, not too big."""
    if v.offloads or any(op.present is not None for op in v.ops.values()):
        return False
    per_device: dict[int, int] = defaultdict(int)
    for op in v.ops.values():
        per_device[op.device] += 1
    return max(per_device.values(), default=0) <= SEQUENCE_MAX_DEVICE_OPS


def _orders(
    v: Variables, dag: nx.DiGraph, chains: list[tuple[OpKey, OpKey]]
) -> dict[OpKey, set[OpKey]]:
    """Per compute op, the compute ops of its device that must come after it (the DAG's
    paths and the symmetry-breaking chains, closed transitively)."""
    graph = nx.DiGraph()
    graph.add_nodes_from(dag.nodes)
    graph.add_edges_from(dag.edges)
    graph.add_edges_from(chains)
    closure: dict[OpKey, set[OpKey]] = {}
    for key in nx.topological_sort(graph):
        op = v.ops.get(key)
        if op is None or key.kind not in _COMPUTE:
            continue
        closure[key] = {
            k for k in nx.descendants(graph, key) if k in v.ops and v.ops[k].device == op.device
        }
    return closure


def add_sequence_memory(
    model: cp_model.CpModel, v: Variables, dag: nx.DiGraph, chains: list[tuple[OpKey, OpKey]]
) -> None:
    """The cap of every device at the start of each of its forwards (module docstring).

    ``chains`` are the pairs the symmetry breaking orders (they fix literals; the
    constraints themselves are added by :func:`~.constraints.add_symmetry_breaking`).
    """
    after = _orders(v, dag, chains)
    for device, ops in sorted(_by_device(v).items()):
        before = _pair_literals(model, ops, after, v.orders)
        add_order_steps(model, [o.key for o in ops if o.size > 0], before)
        room = v.scaling.cap(v.problem.activation_room(device))
        alloc: dict[OpKey, int] = defaultdict(int)
        free: dict[OpKey, int] = defaultdict(int)
        for size, a, f in _lifetimes(v, ops):
            alloc[a] += size
            free[f] += size
        # Alike W (as long, freeing as much) run in their backwards' order (w_order).
        add_w_order(model, [o.key for o in ops], before, w_class(v.problem))
        for x in ops:
            if x.key.kind is not OpKind.F:
                continue
            terms: list[cp_model.LinearExprT] = []
            level = alloc[x.key]
            for y in ops:
                if y is x:
                    continue
                amount = alloc[y.key] - free[y.key]
                if amount == 0:
                    continue
                lit = before[(y.key, x.key)]
                if isinstance(lit, bool):
                    level += amount if lit else 0
                else:
                    terms.append(amount * lit)
            if not terms:
                if level > room:
                    model.add_bool_or([])  # no order fits: infeasible
                continue
            model.add(level + sum(terms) <= room)


def add_memory_orders(
    model: cp_model.CpModel, v: Variables, dag: nx.DiGraph, chains: list[tuple[OpKey, OpKey]]
) -> list[tuple[OpKey, OpKey]]:
    """State the orders the caps force (:mod:`.memory_order`) and those of alike ``W`` whose
    backwards are ordered (:mod:`.w_order`), and return them: ``y`` ends before ``x``
    starts for each pair ``(y, x)``."""
    graph = nx.DiGraph(dag)
    graph.add_edges_from(chains)
    by_device = _by_device(v)
    keys = {d: [o.key for o in ops] for d, ops in by_device.items()}
    lifetimes = {d: _lifetimes(v, ops) for d, ops in by_device.items()}
    rooms = {d: v.scaling.cap(v.problem.activation_room(d)) for d in by_device}
    alike = w_class(v.problem)
    pairs: list[tuple[OpKey, OpKey]] = []
    while True:  # each side's orders may give the other new ones
        pairs += memory_orders(graph, keys, lifetimes, rooms)
        graph.add_edges_from(pairs)
        w_pairs = implied_w_orders(graph, keys, alike)
        if not w_pairs:
            break
        pairs += w_pairs
        graph.add_edges_from(w_pairs)
    for y, x in pairs:
        model.add(v.ops[y].end <= v.ops[x].start)
    return pairs


def _by_device(v: Variables) -> dict[int, list[OpVar]]:
    """Each device's compute ops, microbatch by microbatch."""
    by_device: dict[int, list[OpVar]] = defaultdict(list)
    for op in v.ops.values():
        if op.stream is Stream.COMPUTE and op.key.kind in _COMPUTE:
            by_device[op.device].append(op)
    for ops in by_device.values():
        ops.sort(key=lambda o: (o.key.microbatch, o.key.stage, o.key.kind.value))
    return dict(by_device)


def _pair_literals(
    model: cp_model.CpModel,
    ops: list[OpVar],
    after: dict[OpKey, set[OpKey]],
    literals: dict[tuple[OpKey, OpKey], cp_model.IntVar],
) -> Before:
    """``before[(a, b)]``: True, False, or a literal for "``a`` ends before ``b`` starts",
    with each literal tied to the op times in both directions (and kept in ``literals``,
    for the hints)."""
    before: Before = {}
    for i, a in enumerate(ops):
        for b in ops[i + 1 :]:
            if b.key in after.get(a.key, ()):
                before[(a.key, b.key)], before[(b.key, a.key)] = True, False
            elif a.key in after.get(b.key, ()):
                before[(a.key, b.key)], before[(b.key, a.key)] = False, True
            else:
                lit = model.new_bool_var(f"before_{a.key.kind.value}{a.key.stage}_"
                                         f"{a.key.microbatch}_{b.key.kind.value}"
                                         f"{b.key.stage}_{b.key.microbatch}")  # fmt: skip
                model.add(a.end <= b.start).only_enforce_if(lit)
                model.add(b.end <= a.start).only_enforce_if(~lit)
                before[(a.key, b.key)], before[(b.key, a.key)] = lit, ~lit
                literals[(a.key, b.key)] = lit
    return before


def add_order_steps(model: cp_model.CpModel, keys: list[OpKey], before: Before) -> None:
    """``a`` before ``b`` implies ``a`` before every op fixed after ``b``, and every op fixed
    before ``a`` before ``b``: one implication per literal of ``keys`` (ops of one device
    that last more than 0) and neighbour in the fixed order.

    The times imply them already (durations are positive), but only once the bounds are
    tight; stated on the literals, an order decided on one op of a chain (a stage's forwards,
    its backwards) reaches the rest of the chain by unit propagation, and the memory sums
    of :func:`add_sequence_memory` see the whole step at once. Measured on p 4, m 12,
    cap 2.5 (``scripts/makespan_question.py``): "<= 38.25?" answered no in 157 s
    instead of 225 s (seed 0, same machine).
    Ops of zero duration must be left out: two of them at one moment are before each other.
    """
    fixed = nx.DiGraph()
    fixed.add_nodes_from(keys)
    fixed.add_edges_from((a, b) for a in keys for b in keys if a != b and before[(a, b)] is True)
    steps = nx.transitive_reduction(fixed)
    for a in keys:
        for b in keys:
            lit = True if a == b else before[(a, b)]
            if isinstance(lit, bool):
                continue
            implied = [before[(a, c)] for c in steps.successors(b)]
            implied += [before[(c, b)] for c in steps.predecessors(a)]
            for then in implied:
                if then is False:
                    model.add_bool_or([~lit])
                elif then is not True:
                    model.add_implication(lit, then)


def _lifetimes(v: Variables, ops: list[OpVar]) -> list[tuple[int, OpKey, OpKey]]:
    """``(demand, alloc op, free op)`` of every activation lifetime of these ops, in model
    units (rounded up unless exact, as the cumulative's)."""
    out = []
    seen: set[tuple[int, int]] = set()
    for op in ops:
        sj = (op.key.stage, op.key.microbatch)
        if sj in seen:
            continue
        seen.add(sj)
        for alloc, free, amount, _lit in memory_uses(v, *sj):
            demand = v.scaling.mem(amount)
            if demand > 0:
                out.append((demand, alloc[0].key, free[0].key))
    return out
