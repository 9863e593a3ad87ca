"""What the order generators share: building an :class:`Order`, rank-to-device mapping, and
re-splitting a problem into the placement a pattern needs.

A generator describes each pipeline rank's compute-stream op order; these helpers turn
that into the per-``(device, stream)`` :class:`~pp_opt.order.Order` the simulator times.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from pp_opt.errors import ProblemError
from pp_opt.ops import OpKey
from pp_opt.order import Order, Variant, compute_streams
from pp_opt.problem import Problem
from pp_opt.problem_io import resplit

logger = logging.getLogger(__name__)

OrderGenerator = Callable[..., Order]
"""``(problem, **options) -> Order``: the order of ``problem`` (or of a re-split problem
when the pattern needs another placement). The registry says which keyword options a
generator takes besides the problem (:attr:`pp_opt.orders.registry.Entry.options`).
Raises a :class:`~pp_opt.errors.PPOptError` when it has no order for the problem."""

FUSED = Variant(split_backward=False, offload=False, recompute=False)
"""Compute-only ops with the fused ``BW`` backward (GPipe, 1F1B, interleaved 1F1B)."""
SPLIT = Variant(split_backward=True, offload=False, recompute=False)
"""Compute-only ops with ``B`` and ``W`` (the zero-bubble patterns)."""


def compute_order(
    problem: Problem, per_device: Sequence[Sequence[OpKey]], variant: Variant, name: str = ""
) -> Order:
    """An :class:`Order` of one compute-stream op list per device."""
    return Order(problem=problem, streams=compute_streams(per_device), variant=variant, name=name)


def rank_order(
    problem: Problem, per_rank: Sequence[Sequence[OpKey]], variant: Variant, name: str = ""
) -> Order:
    """Map per-rank lists of a one-chunk pattern (rank = stage) onto the problem's devices.

    Lets the patterns that assume stage ``s`` on rank ``s`` also serve explicit
    placements that give every device one stage in another order.
    """
    per_device: list[list[OpKey]] = [[] for _ in range(problem.p)]
    for rank, ops in enumerate(per_rank):
        per_device[problem.device_of(rank)] = list(ops)
    return compute_order(problem, per_device, variant, name)


def one_chunk(problem: Problem, name: str) -> Problem:
    """The problem with one stage per device, re-split from ``v`` chunks when it has more.

    The one-chunk patterns (GPipe, 1F1B, ZB-H1, ZB-H2) run each device's layers as
    one stage; a problem with several chunks per device is merged back
    (:func:`pp_opt.problem_io.resplit` with ``loop`` and ``v = 1``).
    """
    if problem.num_stages == problem.p:
        return problem
    logger.info("%s: re-splitting %s placement (v = %d) into one stage per device",
                name, problem.placement, problem.v)  # fmt: skip
    return resplit(problem, "loop", 1)


def with_placement(problem: Problem, name: str, placement: str, v: int) -> Problem:
    """The problem in ``placement`` with ``v`` chunks per device, re-split if it is not."""
    if problem.placement == placement and problem.v == v:
        return problem
    logger.info("%s: re-splitting into %s placement with v = %d", name, placement, v)
    return resplit(problem, placement, v)


def require_split_backward(problem: Problem, name: str) -> None:
    """The zero-bubble patterns need ``B`` and ``W`` as separate ops."""
    if not problem.split_backward:
        raise ProblemError(
            "split_backward",
            f"{name} splits the backward into B and W but the problem sets "
            "split_backward = false; set it to true or use gpipe, 1f1b or interleaved-1f1b",
        )


def same_placement(a: Problem, b: Problem) -> bool:
    """Whether two problems put the same stages on the same devices (a hint must match)."""
    return [s.device for s in a.stages] == [s.device for s in b.stages] and a.m == b.m
