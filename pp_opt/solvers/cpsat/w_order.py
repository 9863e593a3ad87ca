"""Alike ``W`` ops run in the order of their backwards: a symmetry the sequence model breaks.

A ``W`` waits for its own ``B`` (and, by the symmetry breaking of
:func:`~.constraints.symmetry_chains`, for the previous microbatch's ``W`` of its
stage); nothing waits for it but the next ``W`` of its stage, and all it does to the
memory is free its part of the activation at its end. Call two ``W`` of one device
*alike* when they last as long and free as much. Given any schedule, take the slots
(start times) of one class of alike ``W`` on a device in time order and give the k-th
slot to the ``W`` whose ``B`` ended k-th. Every slot still follows its ``B`` (the first
k slots held k ``W`` whose ``B`` had ended, so k of the class's ``B`` had ended by the
k-th slot), the device frees the same amounts at the same moments, nothing else moves,
and each stage's ``W`` stay in microbatch order (its ``B`` are). So among the
schedules the symmetry breaking keeps, one optimum runs alike ``W`` in the order of
their ``B``: ``W_x`` before ``W_y`` exactly when ``B_x`` ends before ``B_y`` starts.

On a ``v`` placement with uniform chunks each device holds two stages of alike ``W``:
their interleaving, free before (two microbatch-ordered chains), now follows the
backwards' order. At p 4, m 12, cap 2.5 (``scripts/makespan_question.py``, 2 cores),
proving that no schedule has makespan <= 37.50 took 36-41 s without this and 14-19 s with
it; <= 38.00: 218 s against 94 s; <= 38.25 (the optimum is 38.30): no answer in 360 s
against 202.5 s.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence

import networkx as nx
from ortools.sat.python import cp_model

from pp_opt.ops import OpKey, OpKind, duration, memory_delta
from pp_opt.problem import Problem
from pp_opt.solvers.cpsat.variables import Lit

__all__ = ["add_w_order", "alike_pairs", "implied_w_orders", "in_w_order", "w_class"]


def w_class(problem: Problem) -> Callable[[OpKey], Hashable]:
    """What makes two ``W`` of a device alike: their duration and the memory they free."""

    def alike(key: OpKey) -> tuple[float, float]:
        return duration(problem, key.kind, key.stage), memory_delta(problem, key.kind, key.stage)[1]

    return alike


def alike_pairs(
    keys: Sequence[OpKey], alike: Callable[[OpKey], Hashable]
) -> list[tuple[OpKey, OpKey]]:
    """Pairs of ``W`` of different stages among ``keys`` (one device's) in one class."""
    ws = [k for k in keys if k.kind is OpKind.W]
    return [
        (x, y)
        for i, x in enumerate(ws)
        for y in ws[i + 1 :]
        if x.stage != y.stage and alike(x) == alike(y)
    ]


def implied_w_orders(
    graph: nx.DiGraph,
    device_keys: Mapping[int, Sequence[OpKey]],
    alike: Callable[[OpKey], Hashable],
) -> list[tuple[OpKey, OpKey]]:
    """The pairs ``(W_x, W_y)`` of alike ``W`` whose backwards ``graph`` orders (``B_x``
    before ``B_y`` in every schedule it keeps), not yet ordered themselves."""
    pairs = []
    for keys in device_keys.values():
        alike_ws = alike_pairs(keys, alike)
        ops = {k for pair in alike_ws for w in pair for k in (w, _backward(w))}
        after = {k: nx.descendants(graph, k) for k in ops}
        for x, y in alike_ws:
            bx, by = _backward(x), _backward(y)
            if by in after[bx] and y not in after[x]:
                pairs.append((x, y))
            elif bx in after[by] and x not in after[y]:
                pairs.append((y, x))
    return pairs


def _backward(w: OpKey) -> OpKey:
    return OpKey(OpKind.B, w.stage, w.microbatch)


def add_w_order(
    model: cp_model.CpModel,
    keys: Sequence[OpKey],
    before: Mapping[tuple[OpKey, OpKey], Lit],
    alike: Callable[[OpKey], Hashable],
) -> None:
    """``W_x`` before ``W_y`` iff ``B_x`` before ``B_y``, for alike ``W`` among one device's
    compute ops ``keys`` (module docstring); ``before`` holds every pair's order."""
    for x, y in alike_pairs(keys, alike):
        _same(model, before[(x, y)], before[(_backward(x), _backward(y))])


def _same(model: cp_model.CpModel, a: Lit, b: Lit) -> None:
    if isinstance(a, bool) and isinstance(b, bool):
        if a != b:  # every schedule the caps allow breaks the order: none exists
            model.add_bool_or([])
    elif isinstance(a, bool):
        model.add_bool_or([b if a else ~b])
    elif isinstance(b, bool):
        model.add_bool_or([a if b else ~a])
    else:
        model.add(a == b)


def in_w_order(sequence: Sequence[OpKey], alike: Callable[[OpKey], Hashable]) -> list[OpKey]:
    """One device's op sequence with each class of alike ``W`` given its slots in the order
    of the class's ``B`` in the sequence (module docstring), e.g. for a warm start."""
    position = {k: i for i, k in enumerate(sequence)}
    slots: dict[Hashable, list[int]] = {}
    for i, k in enumerate(sequence):
        if k.kind is OpKind.W:
            slots.setdefault(alike(k), []).append(i)
    out = list(sequence)
    for where in slots.values():
        owners = sorted(
            (sequence[i] for i in where),
            key=lambda w: position.get(_backward(w), -1),
        )
        for i, w in zip(where, owners, strict=True):
            out[i] = w
    return out
