"""Memory: static plus activation memory under each device's cap at every instant.

The sweep here is the validator's own (it shares nothing with
:mod:`pp_opt.metrics`); only the memory effect of each op comes from
:func:`pp_opt.ops.memory_delta`, the one place that defines it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pp_opt.ops import memory_delta
from pp_opt.schedule import ScheduledOp
from pp_opt.validator.context import Context
from pp_opt.validator.violation import Violation


@dataclass(frozen=True, slots=True)
class Level:
    """Memory of a device just after an allocation: when, how much, which op allocated."""

    time: float
    level: float
    op: ScheduledOp


def device_levels(ctx: Context, device: int, *, slack: float) -> Iterator[Level]:
    """The level after each allocation on ``device``, in time order.

    Memory only rises at allocations, so these are the only instants a cap can
    be broken. Frees up to ``slack`` after an allocation count as before it
    (at equal times frees happen first; the slack absorbs rounding of times).
    """
    allocations: list[tuple[float, float, ScheduledOp]] = []
    frees: list[tuple[float, float]] = []
    for op in ctx.by_device[device]:
        recomputed = (op.stage, op.microbatch) in ctx.recomputed
        deltas = memory_delta(
            ctx.problem, op.kind, op.stage, fraction=op.fraction, recomputed=recomputed
        )
        for time, delta in zip((op.start, op.end), deltas, strict=True):
            if delta > 0:
                allocations.append((time, delta, op))
            elif delta < 0:
                frees.append((time, delta))
    allocations.sort(key=lambda a: (a[0], a[2].stage, a[2].microbatch, a[2].kind.value))
    frees.sort()
    level = ctx.problem.devices[device].static
    next_free = 0
    for time, delta, op in allocations:
        while next_free < len(frees) and frees[next_free][0] <= time + slack:
            level += frees[next_free][1]
            next_free += 1
        level += delta
        yield Level(time=time, level=level, op=op)


def peak_levels(ctx: Context) -> list[float]:
    """Highest static + activation memory of each device (exact times, frees first)."""
    peaks = []
    for device in range(ctx.problem.p):
        levels = [lv.level for lv in device_levels(ctx, device, slack=0.0)]
        peaks.append(max([ctx.problem.devices[device].static, *levels]))
    return peaks


def check_memory(ctx: Context) -> list[Violation]:
    """One violation per device over its cap: at its worst instant, with the first and count."""
    found = []
    for device in range(ctx.problem.p):
        cap = ctx.problem.devices[device].cap
        over = [
            lv
            for lv in device_levels(ctx, device, slack=ctx.time_tol)
            if lv.level - cap > ctx.memory_tol
        ]
        if not over:
            continue
        worst = max(over, key=lambda lv: lv.level)
        found.append(
            Violation(
                rule="memory",
                message=(
                    f"memory reaches {worst.level:.6g} at time {worst.time:.6g} as this op "
                    f"allocates, over the cap {cap:.6g} by {worst.level - cap:.6g} "
                    f"(first over at {over[0].time:.6g}, {len(over)} allocation(s) over)"
                ),
                op=worst.op.key,
                device=device,
                amount=worst.level - cap,
            )
        )
    return found
