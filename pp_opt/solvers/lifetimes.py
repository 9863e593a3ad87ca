"""Memory lifetimes of one activation: which op allocates what, and which op frees it.

Both backends and the large-neighbourhood search model a device's memory as a
cumulative of lifetimes ``[alloc, free)``; :func:`match_lifetimes` pairs the memory
effects of :func:`pp_opt.ops.memory_delta` into such lifetimes, and
:func:`activation_events` lists those effects for one activation and one choice (kept,
offloaded at a fraction, or recomputed).
"""

from __future__ import annotations

from typing import TypeVar

from pp_opt.ops import OpKind, memory_delta
from pp_opt.problem import Problem

Ref = TypeVar("Ref")
"""Whatever names a moment (an op's start or end) for the caller."""


def match_lifetimes(
    allocs: list[tuple[Ref, float]], frees: list[tuple[Ref, float]]
) -> list[tuple[Ref, Ref, float]]:
    """Match frees to allocations first-in first-out: ``(alloc, free, amount)``.

    Both lists are in the order the DAG forces on them, and each free only draws on
    allocations that precede it (an offload only on its forward, a backward on the
    forward and the reload or recompute), so the lifetimes reproduce the memory level.
    """
    out: list[tuple[Ref, Ref, float]] = []
    queue = [(ref, amount) for ref, amount in allocs if amount > 0]
    for free, amount in frees:
        while amount > 1e-12 and queue:
            alloc, left = queue[0]
            take = min(amount, left)
            out.append((alloc, free, take))
            amount -= take
            if left - take <= 1e-12:
                queue.pop(0)
            else:
                queue[0] = (alloc, left - take)
    return out


Moment = tuple[OpKind, bool]
"""An op kind of the activation and whether its end (True) or start (False) is meant."""


def activation_events(
    problem: Problem,
    stage: int,
    *,
    split_backward: bool,
    offload_fraction: float | None = None,
    recomputed: bool = False,
) -> tuple[list[tuple[Moment, float]], list[tuple[Moment, float]]]:
    """Allocations and frees of one activation, each in the order the DAG forces.

    ``offload_fraction`` is the part moved by its ``OFFLOAD``/``RELOAD`` pair (None when
    it is kept); ``recomputed`` says its forward is recomputed by an ``R`` op.
    """
    allocs: list[tuple[Moment, float]] = [
        ((OpKind.F, False), memory_delta(problem, OpKind.F, stage, recomputed=recomputed)[0])
    ]
    frees: list[tuple[Moment, float]] = []
    if recomputed:
        allocs.append(((OpKind.R, False), memory_delta(problem, OpKind.R, stage)[0]))
    if offload_fraction is not None:
        moved = memory_delta(problem, OpKind.OFFLOAD, stage, fraction=offload_fraction)[1]
        frees.append(((OpKind.OFFLOAD, True), -moved))
        back = memory_delta(problem, OpKind.RELOAD, stage, fraction=offload_fraction)[0]
        allocs.append(((OpKind.RELOAD, False), back))
    if split_backward:
        frees.append(((OpKind.B, True), -memory_delta(problem, OpKind.B, stage)[1]))
        frees.append(((OpKind.W, True), -memory_delta(problem, OpKind.W, stage)[1]))
    else:
        frees.append(((OpKind.BW, True), -memory_delta(problem, OpKind.BW, stage)[1]))
    return allocs, frees
