"""ZB-V: the Zero Bubble paper's V-shape schedule (two chunks per device, ``v`` placement).

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), Section 6: rank
``i`` holds stage ``i`` (chunk 0, going down) and stage ``2p - 1 - i`` (chunk 1,
coming back up), so the first and last stage share rank 0 and both forward
and backward waves fold back on themselves. With ``t_f = t_b = t_w`` and enough
microbatches the pattern has no bubble at a peak of ``p`` whole-device
activations (``2p`` chunk activations of ``m_b / 2``), the cap of 1F1B.

The order is the one PyTorch ships as ``ScheduleZBVZeroBubble``:

1. ``2(p - i) - 1`` chunk-0 forwards, then ``i`` pairs (chunk-1 forward, chunk-0 forward);
2. ``p - i`` rounds of chunk-1 ``F``, ``B``, ``W``;
3. steady rounds: chunk-0 ``F`` (while any are left), ``B``, ``W``, then chunk-1
   ``F``, ``B``, ``W``;
4. cool-down: ``i`` pairs of ``B`` (chunk 0, chunk 1) holding their ``W``, then
   ``p - i`` rounds of chunk-0 ``B`` and the oldest held chunk-0 ``W``; then the
   held chunk-1 ``W`` ops, then the held chunk-0 ``W`` ops.

Microbatches are counted up to ``max(m, 2p - 1)`` and those past ``m`` dropped,
as PyTorch does, so small ``m`` still gets a deadlock-free order.
"""

from __future__ import annotations

from pp_opt.ops import OpKey, OpKind
from pp_opt.order import Order
from pp_opt.orders.common import SPLIT, compute_order, require_split_backward, with_placement
from pp_opt.problem import Problem

F, B, W = OpKind.F, OpKind.B, OpKind.W


class _RankOrder:
    """Builds one rank's order, numbering each (kind, chunk) stream of microbatches."""

    def __init__(self, stages: tuple[int, int]) -> None:
        self.stages = stages
        self.count = {(kind, c): 0 for kind in (F, B, W) for c in (0, 1)}
        self.ops: list[OpKey] = []

    def put(self, kind: OpKind, chunk: int) -> None:
        j = self.count[(kind, chunk)]
        self.ops.append(OpKey(kind, self.stages[chunk], j))
        self.count[(kind, chunk)] = j + 1

    def done(self, kind: OpKind, chunk: int) -> int:
        return self.count[(kind, chunk)]


def zb_v_rank(rank: int, p: int, m: int) -> list[OpKey]:
    """The ZB-V order of one rank (stages ``rank`` and ``2p - 1 - rank``)."""
    n = max(m, 2 * p - 1)
    o = _RankOrder((rank, 2 * p - 1 - rank))
    for _ in range(2 * (p - rank) - 1):
        o.put(F, 0)
    for _ in range(rank):
        o.put(F, 1)
        o.put(F, 0)
    for _ in range(p - rank):
        for kind in (F, B, W):
            o.put(kind, 1)
    while o.done(F, 1) < o.done(F, 0) or o.done(F, 0) < n:
        if o.done(F, 0) < n:
            o.put(F, 0)
        o.put(B, 0)
        o.put(W, 0)
        for kind in (F, B, W):
            o.put(kind, 1)
    for _ in range(rank):
        o.put(B, 0)
        o.put(B, 1)
    for _ in range(p - rank):
        o.put(B, 0)
        o.put(W, 0)
    for chunk in (1, 0):
        while o.done(W, chunk) < o.done(B, chunk):
            o.put(W, chunk)
    return [key for key in o.ops if key.microbatch < m]


def zb_v(problem: Problem) -> Order:
    """ZB-V on the ``v`` placement (re-split into two chunks per device if needed).

    This is the fixed pattern; :func:`pp_opt.orders.greedy.zb_v_greedy.zb_v_greedy` is the
    Zero Bubble paper's cost-aware greedy for the same placement.
    """
    require_split_backward(problem, "zb-v")
    problem = with_placement(problem, "zb-v", "v", 2)
    per_device = [zb_v_rank(r, problem.p, problem.m) for r in range(problem.p)]
    return compute_order(problem, per_device, SPLIT, "zb-v")
