"""A split-backward schedule with each ``B`` and its ``W`` fused, re-timed: what the
``--fused-backward`` CSV runs, and what it costs.

The order is the CSV's (:func:`pp_opt.export.torch_csv.fuse_backward`): on every device
a ``BW`` where the ``B`` stood, its ``W`` dropped. A fused backward holds the whole
activation until it ends, so the re-timed schedule is also checked against the memory
caps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pp_opt.errors import ProblemError
from pp_opt.ops import OpKey, OpKind, Stream
from pp_opt.orders.common import FUSED, compute_order
from pp_opt.schedule import Schedule


@dataclass(kw_only=True, slots=True, frozen=True)
class FusedCost:
    """A schedule and its fused-backward twin."""

    schedule: Schedule
    """The fused schedule, re-timed by the simulator."""
    split_makespan: float
    """The split schedule's makespan."""
    fused_makespan: float
    """The fused schedule's makespan."""
    violations: tuple[str, ...]
    """What the fused schedule breaks (memory), empty when it is valid."""

    @property
    def added(self) -> float:
        """Makespan the fused backward adds."""
        return self.fused_makespan - self.split_makespan


def has_split_backward(schedule: Schedule) -> bool:
    return any(op.kind is OpKind.W for op in schedule.ops)


def fused_backward_schedule(schedule: Schedule) -> FusedCost:
    """Re-time ``schedule``'s compute order with each ``B`` and its ``W`` fused."""
    from pp_opt.simulator import simulate
    from pp_opt.validator import validate

    kinds = {op.kind for op in schedule.ops}
    if kinds & {OpKind.OFFLOAD, OpKind.RELOAD, OpKind.R}:
        raise ProblemError(
            "schedule", "fusing the backward re-times the compute order only; this schedule "
            "offloads or recomputes: drop those first (solve without them)"
        )  # fmt: skip
    problem = schedule.problem
    per_device = []
    pairs: dict[OpKey, OpKey] = {}  # an overlapped pair keeps its forward, now with a BW
    for device in range(problem.p):
        ops = []
        for op in schedule.stream_order(device, Stream.COMPUTE):
            if op.kind is OpKind.W:
                continue
            if op.partner is not None:
                pairs[op.order_key] = op.partner._replace(kind=OpKind.BW)
            kind = OpKind.BW if op.kind is OpKind.B else op.kind
            ops.append(op.order_key if op.partner else OpKey(kind, op.stage, op.microbatch))
        per_device.append(ops)
    order = compute_order(problem, per_device, FUSED, "fused backward")
    fused = simulate(replace(order, pairs=pairs))
    violations = tuple(str(v) for v in validate(fused))
    return FusedCost(
        schedule=fused, split_makespan=schedule.metrics.makespan,
        fused_makespan=fused.metrics.makespan, violations=violations,
    )  # fmt: skip
