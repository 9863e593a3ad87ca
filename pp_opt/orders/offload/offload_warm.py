"""Warm starts under caps that only offload meets: a classic schedule plus copies in its gaps.

A schedule made for a larger cap keeps its compute timing (so its objective)
when each activation is copied to the host right after its forward and copied
back just in time for its backward, wherever the copy streams have room.
Whether the result fits the real cap is left to the validator.
"""

from __future__ import annotations

from pp_opt.errors import NoOrderError
from pp_opt.metrics import compute_metrics
from pp_opt.ops import BACKWARD_KINDS, OpKind, Stream, duration
from pp_opt.order import Order, Variant
from pp_opt.problem import Device, Problem
from pp_opt.schedule import Schedule, ScheduledOp, dag_ops
from pp_opt.simulator import order_of


def roomy(problem: Problem) -> Problem:
    """The problem without offload and without caps: where the base schedules are made."""
    return problem.replace(
        offload=False,
        devices=tuple(Device(cap=1e300, static=d.static) for d in problem.devices),
    )


RAISED_CAPS = (1.25, 1.5)
"""Factors of the room (cap minus static) at which offload warm starts also make their
compute orders (:func:`raised`): an order made for somewhat more memory than the cap,
with copies for the difference, keeps most of its speed where an order made without any
cap needs more copies than the host links carry."""


def raised(problem: Problem) -> list[Problem]:
    """The problem without offload, its room raised by each of :data:`RAISED_CAPS`."""
    out = []
    for factor in RAISED_CAPS:
        devices = tuple(Device(cap=d.static + factor * (d.cap - d.static), static=d.static)
                        for d in problem.devices)  # fmt: skip
        out.append(problem.replace(offload=False, devices=devices))
    return out


def with_offloads(problem: Problem, schedule: Schedule, fraction: float) -> Order:
    """``schedule``'s compute ops on ``problem``, with every activation offloaded that fits.

    Offloads run in forward order as early as possible; reloads in backward order
    as late as possible (ending at their backward's start); an activation whose
    offload would not end before its reload starts is kept. The order keeps the
    cross-stream waits of that timing (:func:`pp_opt.simulator.order_of`), so
    simulating it keeps the compute timing. Raises :class:`NoOrderError` when the
    problem does not allow offload, or devices share a host link (their copies would
    collide).
    """
    if not problem.offload:
        raise NoOrderError("offload", "the problem does not allow offload")
    if problem.host_links:
        raise NoOrderError("offload", "devices share a host link; copies would collide")
    compute = [op for op in schedule.ops if op.stream is Stream.COMPUTE]
    ops: list[ScheduledOp] = list(compute)
    for device in range(problem.p):
        own = dag_ops(op for op in compute if problem.device_of(op.stage) == device)
        f_end = {(op.stage, op.microbatch): op.end for op in own if op.kind is OpKind.F}
        b_start = {(op.stage, op.microbatch): op.start for op in own if op.kind in BACKWARD_KINDS}
        offloads: dict[tuple[int, int], tuple[float, float]] = {}
        t = 0.0
        for act in sorted(f_end, key=lambda a: (f_end[a], a)):
            start = max(f_end[act], t)
            t = start + duration(problem, OpKind.OFFLOAD, act[0], fraction)
            offloads[act] = (start, t)
        reloads: dict[tuple[int, int], tuple[float, float]] = {}
        t = float("inf")
        for act in sorted(b_start, key=lambda a: (b_start[a], a), reverse=True):
            end = min(b_start[act], t)
            t = end - duration(problem, OpKind.RELOAD, act[0], fraction)
            reloads[act] = (t, end)
        for act, (o_start, o_end) in offloads.items():
            r_start, r_end = reloads[act]
            if o_end <= r_start:
                ops.append(ScheduledOp(OpKind.OFFLOAD, *act, Stream.D2H, o_start, o_end, fraction))
                ops.append(ScheduledOp(OpKind.RELOAD, *act, Stream.H2D, r_start, r_end, fraction))
    variant = Variant(schedule.variant.split_backward, offload=True, recompute=False)
    placed = Schedule(problem=problem, ops=tuple(ops), solver=schedule.solver,
                      metrics=compute_metrics(problem, ops), variant=variant)  # fmt: skip
    order = order_of(placed)
    name = f"{schedule.solver.name}+offload"
    return Order(problem=problem, streams=order.streams, fractions=order.fractions,
                 waits=order.waits, pairs=order.pairs, variant=variant, name=name)  # fmt: skip
