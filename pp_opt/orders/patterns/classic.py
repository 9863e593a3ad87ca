"""GPipe, 1F1B and interleaved 1F1B: the fused-backward classics, as op orders.

- ``gpipe`` (Huang et al., 2019, "GPipe"): every rank runs all forwards, then all
  fused backwards, both in microbatch order. Peak memory ``m`` activations.
- ``1f1b`` (PipeDream-Flush, Narayanan et al., 2021; Megatron-LM's default):
  rank ``i`` runs ``p - 1 - i`` warm-up forwards, then alternates one forward and
  one fused backward, then drains the backwards. Peak memory ``p`` activations.
  With the Zero Bubble paper's A100 costs this order reproduces its 1F1B bubble
  rates (docs/design.md §7).
- ``interleaved-1f1b`` (Narayanan et al., 2021, §2.2, "interleaved schedule";
  the order of Megatron-LM and of PyTorch's ``ScheduleInterleaved1F1B``): ``v``
  chunks per rank on the ``loop`` placement. Microbatches go in rounds of about
  ``p``; within a round each chunk runs every microbatch of the round before the
  next chunk (forwards low chunk first, backwards high chunk first). Rank ``i``
  warms up with ``(v - 1) * round + 2 (p - 1 - i)`` forwards, then alternates.

All three run the fused ``BW`` op, as Megatron-LM and PyTorch do: the gradient
leaves a stage only when its whole backward is done.
"""

from __future__ import annotations

from pp_opt.ops import OpKey, OpKind
from pp_opt.order import Order
from pp_opt.orders.common import FUSED, compute_order, one_chunk, rank_order, with_placement
from pp_opt.problem import Problem

F, BW = OpKind.F, OpKind.BW


def gpipe(problem: Problem) -> Order:
    """GPipe: all forwards, then all fused backwards, on one stage per device."""
    problem = one_chunk(problem, "gpipe")
    m = problem.m
    per_rank = [
        [OpKey(F, r, j) for j in range(m)] + [OpKey(BW, r, j) for j in range(m)]
        for r in range(problem.p)
    ]
    return rank_order(problem, per_rank, FUSED, "gpipe")


def one_f_one_b(problem: Problem) -> Order:
    """1F1B: ``p - 1 - i`` warm-up forwards on rank ``i``, then one forward, one backward."""
    problem = one_chunk(problem, "1f1b")
    p, m = problem.p, problem.m
    per_rank = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        ops = [OpKey(F, r, j) for j in range(warmup)]
        for j in range(warmup, m):
            ops += [OpKey(F, r, j), OpKey(BW, r, j - warmup)]
        ops += [OpKey(BW, r, j) for j in range(m - warmup, m)]
        per_rank.append(ops)
    return rank_order(problem, per_rank, FUSED, "1f1b")


def microbatch_rounds(p: int, m: int) -> list[int]:
    """Sizes of the rounds interleaved 1F1B walks through the chunks together.

    ``max(1, m // p)`` rounds of near-equal size (each ``p`` to ``2p - 1``
    microbatches, or all ``m`` when ``m < p``). PyTorch uses the same rounds and
    rejects ``m`` that they do not divide; giving the first rounds one microbatch
    more keeps every ``m`` deadlock-free.
    """
    count = max(1, m // p)
    return [m // count + (1 if i < m % count else 0) for i in range(count)]


def interleaved_1f1b(problem: Problem) -> Order:
    """Megatron-LM's interleaved 1F1B on the ``loop`` placement (``v >= 2``, else ``v = 2``)."""
    v = problem.v if problem.placement == "loop" and problem.v >= 2 else 2
    problem = with_placement(problem, "interleaved-1f1b", "loop", v)
    p, m = problem.p, problem.m
    rounds = microbatch_rounds(p, m)
    per_device = []
    for r in range(p):
        forwards: list[OpKey] = []
        backwards: list[OpKey] = []
        first = 0
        for size in rounds:
            batch = range(first, first + size)
            forwards += [OpKey(F, c * p + r, j) for c in range(v) for j in batch]
            backwards += [OpKey(BW, c * p + r, j) for c in reversed(range(v)) for j in batch]
            first += size
        total = m * v
        warmup = min((v - 1) * rounds[0] + 2 * (p - 1 - r), total)
        ops = forwards[:warmup]
        for k in range(warmup, total):
            ops += [forwards[k], backwards[k - warmup]]
        ops += backwards[total - warmup :]
        per_device.append(ops)
    return compute_order(problem, per_device, FUSED, "interleaved-1f1b")
