"""What the order generators share: the order type, rank-to-device mapping, and re-splitting.

A generator describes each pipeline rank's compute-stream op order; these helpers
turn that into the per-``(device, stream)`` order the simulator times, and give a
generator the problem in the placement its pattern needs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from pp_opt.errors import ProblemError
from pp_opt.ops import OpKey, Stream
from pp_opt.problem import Problem
from pp_opt.problem_io import resplit

logger = logging.getLogger(__name__)

Order = dict[tuple[int, Stream], list[OpKey]]
"""Per ``(device, stream)``, the ops in the order they run (what the simulator times)."""

OrderGenerator = Callable[[Problem], tuple[Problem, Order]]
"""Takes a problem, returns the problem it actually schedules (maybe re-split) and the order."""


def compute_order(problem: Problem, per_device: Sequence[Sequence[OpKey]]) -> Order:
    """Wrap one compute-stream op list per device into an :data:`Order`."""
    return {(d, Stream.COMPUTE): list(ops) for d, ops in enumerate(per_device)}


def rank_order(problem: Problem, per_rank: Sequence[Sequence[OpKey]]) -> Order:
    """Map per-rank lists of a one-chunk pattern (rank = stage) onto the problem's devices.

    Lets the patterns that assume stage ``s`` on rank ``s`` also serve explicit
    placements that give every device one stage in another order.
    """
    per_device: list[list[OpKey]] = [[] for _ in range(problem.p)]
    for rank, ops in enumerate(per_rank):
        per_device[problem.device_of(rank)] = list(ops)
    return compute_order(problem, per_device)


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
