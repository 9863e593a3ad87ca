"""Memory: static plus activation memory under each device's cap at every instant.

The sweep here is the validator's own (it shares nothing with
:mod:`pp_opt.metrics`); only the memory effect of each op comes from
:func:`pp_opt.ops.memory_delta`, the one place that defines it, the order of frees
and allocations from :func:`pp_opt.time_rule.settle_frees`, and the sums from
:func:`pp_opt.levels.running_levels`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pp_opt.levels import running_levels
from pp_opt.ops import memory_delta
from pp_opt.schedule import ScheduledOp
from pp_opt.time_rule import settle_frees
from pp_opt.validator.context import Context
from pp_opt.validator.violation import Violation


@dataclass(frozen=True, slots=True)
class Level:
    """Memory of a device just after an allocation: when, how much, which op allocated."""

    time: float
    level: float
    op: ScheduledOp


Events = tuple[list[tuple[float, float, int | None]], list[ScheduledOp]]


def _events(ctx: Context, device: int) -> Events:
    """The device's memory events ``(time, delta, op index or None for a free)`` in the
    order the time rule applies them, and its ops (listed once: two checks use them)."""
    if device not in ctx.memory_events:
        ctx.memory_events[device] = _list_events(ctx, device)
    found: Events = ctx.memory_events[device]
    return found


def _list_events(ctx: Context, device: int) -> Events:
    own = ctx.by_device[device]
    allocations: list[tuple[float, int, int, str, float, int]] = []
    frees: list[tuple[float, float]] = []
    for i, op in enumerate(own):
        recomputed = (op.stage, op.microbatch) in ctx.recomputed
        at_start, at_end = memory_delta(
            ctx.problem, op.kind, op.stage, fraction=op.fraction, recomputed=recomputed
        )
        for time, delta in ((op.start, at_start), (op.end, at_end)):
            if delta > 0:
                allocations.append((time, op.stage, op.microbatch, op.kind.value, delta, i))
            elif delta < 0:
                frees.append((time, delta))
    allocations.sort()  # ties by stage, microbatch, kind: the op a violation names
    frees.sort()
    events: list[tuple[float, float, int | None]] = [(t, d, None) for t, d in frees]
    events += [(a[0], a[4], a[5]) for a in allocations]
    return settle_frees(events, ctx.time_tol), own


def _sweep(ctx: Context, device: int) -> Iterator[tuple[float, float, ScheduledOp]]:
    """``(time, level, op)`` after each allocation on ``device``, in time order."""
    events, own = _events(ctx, device)
    levels = running_levels(ctx.problem.devices[device].static, (e[1] for e in events))
    for (time, _, i), level in zip(events, levels, strict=True):
        if i is not None:
            yield time, level, own[i]


def peak_levels(ctx: Context) -> list[float]:
    """Highest static + activation memory of each device (frees as the time rule says)."""
    peaks = []
    for device in range(ctx.problem.p):
        levels = [level for _, level, _ in _sweep(ctx, device)]
        peaks.append(max([ctx.problem.devices[device].static, *levels]))
    return peaks


def check_memory(ctx: Context) -> list[Violation]:
    """One violation per device over its cap: at its worst instant, with the first and count."""
    found = []
    for device in range(ctx.problem.p):
        cap = ctx.problem.devices[device].cap
        over = [
            Level(time=time, level=level, op=op)
            for time, level, op in _sweep(ctx, device)
            if level - cap > ctx.memory_tol
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
