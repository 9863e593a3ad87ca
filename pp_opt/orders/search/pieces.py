"""What the rule generators share: a compute-only :class:`~pp_opt.order.Order` with its
setting, and the time budget a searching generator takes from a deadline."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from pp_opt.ops import OpKey
from pp_opt.order import Order, Variant, compute_streams
from pp_opt.problem import Problem


def compute_pieces(
    problem: Problem,
    per_device: Sequence[Sequence[OpKey]],
    name: str,
    settings: Mapping[str, Any],
    *,
    split_backward: bool = True,
) -> Order:
    """A compute-only order (no copies, no waits) and its setting."""
    return Order(
        problem=problem,
        streams=compute_streams(per_device),
        variant=Variant(split_backward=split_backward, offload=False, recompute=False),
        name=name,
        settings=dict(settings),
    )


def budget(deadline: float | None, default: float) -> float:
    """Seconds a searching generator may take: ``default``, or half of what is left before
    ``deadline`` (so the generators after it still get time), at least 0.2 s."""
    if deadline is None:
        return default
    return max(0.2, min(default, (deadline - time.perf_counter()) / 2))
