"""The constraint families of the MILP, each one small function (called in ``model.build_model``).

Big-M values come from each op's time window (earliest and latest start), so each M
is as small as the horizon allows.
"""

from __future__ import annotations

from typing import Any

import pulp

from pp_opt.ops import ALLOCATING, FREEING, OpKey, OpKind, memory_delta
from pp_opt.solvers.milp.variables import (
    Expr,
    MilpModel,
    OpVars,
    hint_ended_by,
    hint_order,
    hint_product,
    hint_started_by,
)


def activation_choice(model: MilpModel) -> None:
    """Each activation is kept, offloaded with one of the fractions, or recomputed."""
    v = model.vars
    for act in sorted(set(v.offload) | set(v.recompute)):
        chosen = [z for _, z in v.offload.get(act, [])]
        if act in v.recompute:
            chosen.append(v.recompute[act])
        if len(chosen) > 1:
            model.lp += pulp.lpSum(chosen) <= 1, f"choice_{act[0]}_{act[1]}"


def precedence(model: MilpModel) -> None:
    """``w`` starts after ``u`` ends plus the edge latency, for every DAG edge ``u -> w``.

    An absent optional op takes no time, so the edges through it still hold between
    the ops around it (``F`` before ``B`` holds anyway), and it needs no relaxation.
    """
    ops = model.vars.ops
    for u, w, data in model.dag.edges(data=True):
        model.lp += ops[w].start >= ops[u].end + data["latency"]


def pairs(model: MilpModel) -> None:
    """In a chosen pair both halves start together (their times already last the pair's,
    :mod:`.variables`); each op is a half of at most one pair."""
    v = model.vars
    of_op: dict[OpKey, list[Any]] = {}
    for (f, b), (x, _) in v.pairs.items():
        u, w = v.ops[f], v.ops[b]
        model.lp += u.start - w.start <= (u.latest - w.earliest) * (1 - x)
        model.lp += w.start - u.start <= (w.latest - u.earliest) * (1 - x)
        of_op.setdefault(f, []).append(x)
        of_op.setdefault(b, []).append(x)
    for chosen in of_op.values():
        if len(chosen) > 1:
            model.lp += pulp.lpSum(chosen) <= 1


def symmetry(model: MilpModel) -> None:
    """Microbatches in order where that loses no optimum (the same rule as the CP-SAT model).

    The chains also hold the runtimes' order rules (:mod:`pp_opt.runtime_rules`), kept
    even without symmetry breaking. Microbatches are interchangeable, so renumbering
    them by the start of their last-stage forward keeps every schedule valid:
    ``F(S-1, j)`` before ``F(S-1, j + 1)`` is always safe (and the runtimes' rule).
    Without offload and recompute every activation of a stage has the same costs and
    memory events, so each kind (``F``, ``B``, ``W``, ``BW``)
    can be renumbered on each stage by its own order: give the k-th op in time the
    label k, keeping every time. Each DAG chain (``F`` of stage s-1 to ``F`` of s,
    ``B`` of s+1 to ``B`` of s, the last stage's ``F`` to its ``B``, ``B`` to ``W``)
    links one op per microbatch on each side with ``start(w_j) >= end(u_j) + latency``;
    sorting both sides keeps that (the k-th smallest of larger numbers is larger).
    Streams see the same busy intervals, and memory only counts how many ops of
    each kind started or ended on a stage. With offload or recompute activations
    differ in their choice, so only the last stage's forwards are ordered.
    """
    ops = model.vars.ops
    for u, w in model.chains:
        model.lp += ops[w].start >= ops[u].end


def disjunctive(model: MilpModel) -> None:
    """One op at a time on each resource: an order binary per pair not ordered already.

    Pairs that a chain of precedences orders, or whose time windows cannot overlap,
    get a constant instead. An absent optional op is released from its pairs.
    """
    by_resource: dict[object, list[OpVars]] = {}
    for op in model.vars.ops.values():
        by_resource.setdefault(op.resource, []).append(op)
    for ops in by_resource.values():
        ops.sort(key=lambda o: o.key)
        for i, u in enumerate(ops):
            for w in ops[i + 1 :]:
                _order_pair(model, u, w)
    for (f, b), (x, _) in model.vars.pairs.items():
        # A chosen pair's F counts as first: its halves start together, and the memory
        # counts a free before an allocation by this order (the free comes at the end).
        model.lp += model.vars.before(f, b) >= x


def _order_pair(model: MilpModel, u: OpVars, w: OpVars) -> None:
    v, reach = model.vars, model.reach
    if w.key in reach[u.key] or u.latest + u.max_duration <= w.earliest:
        v.order[u.key, w.key] = 1
        return
    if u.key in reach[w.key] or w.latest + w.max_duration <= u.earliest:
        v.order[u.key, w.key] = 0
        return
    y = v.binary("y", hint_order(u.key, w.key))
    v.order[u.key, w.key] = y
    big_uw = u.latest + u.max_duration - w.earliest
    big_wu = w.latest + w.max_duration - u.earliest
    paired = v.pairs.get((u.key, w.key)) or v.pairs.get((w.key, u.key))
    both: Expr = 0 if paired is None else paired[0]  # a chosen pair's halves share the stream
    model.lp += w.start >= u.end - big_uw * (1 - y) - _released(u, w, big_uw) - big_uw * both
    model.lp += u.start >= w.end - big_wu * y - _released(u, w, big_wu) - big_wu * both


def _released(u: OpVars, w: OpVars, big: float) -> Expr:
    """Slack that switches a pair's constraint off when one of its ops is absent."""
    slack: Expr = 0
    for op in (u, w):
        if op.optional:
            slack = slack + big * (1 - op.presence)
    return slack


def memory(model: MilpModel) -> None:
    """At each allocation, the device's activations stay within ``cap - static``.

    Memory peaks right after an allocation, so checking there is enough. At the
    start of ``a`` we count every allocation that has started (``a`` itself, and
    the others ordered before it) and subtract every free that has ended. An
    allocation after ``a`` never counts; a free counts only when its end is at or
    before ``a``'s start (frees first at equal times, as in ``metrics``). Checks at
    absent optional ops are switched off.
    """
    problem = model.problem
    # Memory in units of the largest activation, so byte-sized numbers do not meet
    # the solvers' absolute tolerances.
    unit = max((st.m_b for st in problem.stages), default=1.0) or 1.0
    allocated = {k: _in_units(allocation_amount(model, k), unit) for k in model.vars.ops}
    freed = {k: _in_units(free_amount(model, k), unit) for k in model.vars.ops}
    for device in range(problem.p):
        own = [o for o in model.vars.ops.values() if o.device == device]
        allocs = [o for o in own if o.key.kind in ALLOCATING]
        frees = [o for o in own if o.key.kind in FREEING]
        budget = problem.activation_room(device) / unit
        most = sum(_largest(allocated[o.key]) for o in allocs)
        if most <= budget + 1e-9:
            continue  # the cap can never bind on this device
        for a in allocs:
            level = _scaled(model, allocated[a.key], 1, +1)
            for e in allocs:
                if e is not a:
                    level += _scaled(model, allocated[e.key], _started_by(model, e, a), +1)
            for e in frees:
                level += _scaled(model, freed[e.key], _ended_by(model, e, a), -1)
            relax = most * (1 - a.presence) if a.optional else 0
            if isinstance(level, int | float) and not a.optional:
                # Fixed by the precedences alone: over the cap means no schedule fits.
                model.infeasible = model.infeasible or level > budget + 1e-9
            else:
                model.lp += level <= budget + relax


def _in_units(
    amount: tuple[float, list[tuple[float, Any]]], unit: float
) -> tuple[float, list[tuple[float, Any]]]:
    const, terms = amount
    return const / unit, [(c / unit, var) for c, var in terms]


def _largest(amount: tuple[float, list[tuple[float, Any]]]) -> float:
    const, terms = amount
    return const + max([0.0] + [c for c, _ in terms if c > 0])


def _scaled(
    model: MilpModel, amount: tuple[float, list[tuple[float, Any]]], ind: Expr, sign: int
) -> Expr:
    """``sign * amount * ind`` made linear (products of binaries get a bounded helper)."""
    const, terms = amount
    expr: Expr = sign * const * ind
    for coef, var in terms:
        c = sign * coef
        if isinstance(ind, int | float):
            expr = expr + c * ind * var
        elif c:
            expr = expr + c * _product(model, var, ind, lower=c > 0)
    return expr


def _product(model: MilpModel, var: Any, ind: Expr, *, lower: bool) -> pulp.LpVariable:
    """A variable equal to ``var * ind`` where it matters: bounded below for terms that
    add memory (the solver wants them small), above for terms that take it away."""
    w = model.vars.continuous("w", 0.0, 1.0, hint_product(var, ind))
    if lower:
        model.lp += w >= var + ind - 1
    else:
        model.lp += w <= var
        model.lp += w <= ind
    return w


def _started_by(model: MilpModel, e: OpVars, a: OpVars) -> Expr:
    """1 when allocation ``e`` counts at ``a``'s start (it started first)."""
    v, reach = model.vars, model.reach
    if a.key in reach[e.key] or e.latest <= a.earliest:
        return 1
    if e.key in reach[a.key] or a.latest < e.earliest:
        return 0
    if e.resource == a.resource:
        return v.before(e.key, a.key)
    pair = (e.key, a.key) if e.key < a.key else (a.key, e.key)
    if pair not in v.started:
        y = v.binary("m", hint_started_by(*pair))
        first, second = model.vars.ops[pair[0]], model.vars.ops[pair[1]]
        model.lp += second.start >= first.start - (first.latest - second.earliest) * (1 - y)
        model.lp += first.start >= second.start - (second.latest - first.earliest) * y
        v.started[pair] = y
    y = v.started[pair]
    return y if pair[0] == e.key else 1 - y


def _ended_by(model: MilpModel, e: OpVars, a: OpVars) -> Expr:
    """1 only when free ``e`` has ended by ``a``'s start (0 is always safe: it under-counts)."""
    v, reach = model.vars, model.reach
    if a.key in reach[e.key] or e.latest + e.max_duration <= a.earliest:
        return 1
    if e.key in reach[a.key] or a.latest < e.earliest:
        return 0
    if e.resource == a.resource:
        return v.before(e.key, a.key)
    q = v.binary("q", hint_ended_by(e.key, a.key))
    model.lp += a.start >= e.end - (e.latest + e.max_duration - a.earliest) * (1 - q)
    return q


def allocation_amount(model: MilpModel, key: OpKey) -> tuple[float, list[tuple[float, Any]]]:
    """Memory an op allocates at its start: a constant plus ``coef * binary`` terms."""
    problem, v, act = model.problem, model.vars, (key.stage, key.microbatch)
    if key.kind is OpKind.F:
        kept = memory_delta(problem, OpKind.F, key.stage)[0]
        if act not in v.recompute:
            return kept, []
        only_input = memory_delta(problem, OpKind.F, key.stage, recomputed=True)[0]
        return kept, [(only_input - kept, v.recompute[act])]
    if key.kind is OpKind.R:
        return 0.0, [(memory_delta(problem, OpKind.R, key.stage)[0], v.recompute[act])]
    if key.kind is OpKind.RELOAD:
        return 0.0, [
            (memory_delta(problem, OpKind.RELOAD, key.stage, fraction=f)[0], z)
            for f, z in v.offload[act]
        ]
    return 0.0, []


def free_amount(model: MilpModel, key: OpKey) -> tuple[float, list[tuple[float, Any]]]:
    """Memory an op frees at its end, in the same form as :func:`allocation_amount`."""
    problem, act = model.problem, (key.stage, key.microbatch)
    if key.kind is OpKind.OFFLOAD:
        return 0.0, [
            (-memory_delta(problem, OpKind.OFFLOAD, key.stage, fraction=f)[1], z)
            for f, z in model.vars.offload[act]
        ]
    return -memory_delta(problem, key.kind, key.stage)[1], []
