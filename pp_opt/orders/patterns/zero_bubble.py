"""ZB-H1 and ZB-H2: the Zero Bubble paper's handcrafted one-chunk schedules.

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), §3.1 and Figure 3.
Both split the backward into ``B`` (gradient of the input, on the critical path)
and ``W`` (gradient of the weights, which nothing downstream waits for) and use
the ``W`` ops to fill the bubbles of 1F1B.

- ``zb-h1``: the warm-up of 1F1B (``p - 1 - i`` forwards on rank ``i``), then
  one forward and one ``B`` at a time, with rank ``i`` keeping its ``W`` ops ``i``
  behind its ``B`` ops and running the held-back ones at the end, where the
  rank would otherwise wait. Same peak memory as 1F1B (``p`` activations at most);
  bubble ``(p - 1)(t_f + t_b - t_w)``. This is also PyTorch's one-chunk
  ``ScheduleInterleavedZeroBubble`` order (``num_1f1b_microbatches = rank``).
- ``zb-h2``: rank ``i`` warms up with ``2 (p - 1 - i) + 1`` forwards, enough to
  fill the wait before its first ``B``; then cycles of ``B``, ``W``, ``F``; in its
  last ``2i`` cycles it holds the ``W`` back, drains the remaining ``B`` ops each
  followed by the oldest held ``W``, and ends with the held ``W`` ops ("reorder
  the W passes at the tail", which makes the layout a parallelogram). Peak memory
  ``2p - 1`` activations; bubble ``(p - 1)(t_f + t_b - 2 t_w)``.

The tail of ZB-H2 (how many ``W`` each rank holds back) is not spelled out in
the paper; ``2i`` on rank ``i`` is the choice that keeps the peak at ``2p - 1``
activations for any ``m_w`` and reproduces the paper's published bubble rates
(docs/design.md §7) with the simulator.

With ``t_comm = 0`` the bubbles above (``max span - busy`` of the busiest device)
are exact when ``t_w <= t_f`` and ``m >= p`` (ZB-H1), and when ``t_w <= t_f``,
``2 t_w <= t_f + t_b`` and ``m >= 2p - 1`` (ZB-H2); ``tests/test_baselines.py``
checks them there.
"""

from __future__ import annotations

from collections.abc import Callable

from pp_opt.ops import OpKey, OpKind
from pp_opt.order import Order
from pp_opt.orders.common import SPLIT, one_chunk, rank_order, require_split_backward
from pp_opt.problem import Problem

F, B, W = OpKind.F, OpKind.B, OpKind.W


def zb_h1_rank(rank: int, p: int, m: int) -> list[OpKey]:
    """ZB-H1 order of one rank (stage ``rank``): 1F1B with ``W`` kept ``rank`` behind."""
    warmup = min(p - 1 - rank, m)
    ops = [OpKey(F, rank, j) for j in range(warmup)]
    held = 0  # B ops whose W has not run yet

    def backward(j: int) -> None:
        nonlocal held
        ops.append(OpKey(B, rank, j))
        held += 1
        if held > rank:
            ops.append(OpKey(W, rank, j - rank))
            held -= 1

    for j in range(warmup, m):
        ops.append(OpKey(F, rank, j))
        backward(j - warmup)
    for j in range(m - warmup, m):
        backward(j)
    ops += [OpKey(W, rank, j) for j in range(m - held, m)]
    return ops


def zb_h1(problem: Problem) -> Order:
    """ZB-H1 on one stage per device (Zero Bubble paper, §3.1)."""
    return _one_chunk_order(problem, "zb-h1", zb_h1_rank)


def zb_h2_rank(rank: int, p: int, m: int) -> list[OpKey]:
    """ZB-H2 order of one rank (stage ``rank``)."""
    warmup = min(2 * (p - 1 - rank) + 1, m)
    ops = [OpKey(F, rank, j) for j in range(warmup)]
    cycles = m - warmup
    hold_from = cycles - min(2 * rank, cycles)  # the last 2 * rank cycles hold their W
    pending: list[int] = []  # microbatches whose B ran and W did not, oldest first
    for c in range(cycles):
        ops.append(OpKey(B, rank, c))
        pending.append(c)
        if c < hold_from:
            ops.append(OpKey(W, rank, pending.pop(0)))
        ops.append(OpKey(F, rank, warmup + c))
    for j in range(cycles, m):
        ops.append(OpKey(B, rank, j))
        pending.append(j)
        ops.append(OpKey(W, rank, pending.pop(0)))
    ops += [OpKey(W, rank, j) for j in pending]
    return ops


def zb_h2(problem: Problem) -> Order:
    """ZB-H2 on one stage per device (Zero Bubble paper, §3.1)."""
    return _one_chunk_order(problem, "zb-h2", zb_h2_rank)


def _one_chunk_order(
    problem: Problem, name: str, rank_ops: Callable[[int, int, int], list[OpKey]]
) -> Order:
    """The split-backward order ``name`` on one stage per device, from each rank's ops."""
    require_split_backward(problem, name)
    problem = one_chunk(problem, name)
    per_rank = [rank_ops(r, problem.p, problem.m) for r in range(problem.p)]
    return rank_order(problem, per_rank, SPLIT, name)
