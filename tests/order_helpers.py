"""Time hand-written op orders: the variant comes from the op kinds the order uses."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pp_opt.ops import OpKey, OpKind, Stream
from pp_opt.order import Order, Variant
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule
from pp_opt.simulator import simulate


def order(
    problem: Problem,
    streams: Mapping[tuple[int, Stream], Sequence[OpKey]],
    *,
    fractions: Mapping[OpKey, float] | None = None,
    waits: Iterable[tuple[OpKey, OpKey]] = (),
) -> Order:
    """An :class:`Order` of ``problem`` in the variant its op kinds use."""
    kinds = [key.kind for keys in streams.values() for key in keys]
    variant = Variant.of_kinds(kinds, split_backward=problem.split_backward)
    return Order(problem=problem, streams=streams, fractions=dict(fractions or {}),
                 waits=tuple(waits), variant=variant)  # fmt: skip


def timed(
    problem: Problem,
    streams: Mapping[tuple[int, Stream], Sequence[OpKey]],
    *,
    fractions: Mapping[OpKey, float] | None = None,
    waits: Iterable[tuple[OpKey, OpKey]] = (),
) -> Schedule:
    """:func:`pp_opt.simulator.simulate` of :func:`order`."""
    return simulate(order(problem, streams, fractions=fractions, waits=waits))


def overtaking_schedule(problem: Problem) -> Schedule:
    """1F1B-like order on p = 2 where the last stage runs F(1, 1) before F(1, 0): valid
    for the DAG, but PyTorch's runtime then fails with 'Loss for microbatch 1 is not
    available'."""
    m = problem.m
    dev0 = [OpKey(OpKind.F, 0, j) for j in range(m)] + [
        OpKey(k, 0, j) for j in range(m) for k in (OpKind.B, OpKind.W)
    ]
    last = [1, 0, *range(2, m)]
    dev1 = [OpKey(OpKind.F, 1, j) for j in last] + [
        OpKey(k, 1, j) for j in last for k in (OpKind.B, OpKind.W)
    ]
    streams = {(0, Stream.COMPUTE): dev0, (1, Stream.COMPUTE): dev1}
    return simulate(Order(problem=problem, streams=streams, variant=Variant(True, False, False)))
