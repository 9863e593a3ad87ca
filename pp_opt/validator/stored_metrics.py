"""Stored metrics: recomputed from the ops alone and compared with what the schedule says."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pp_opt.ops import Stream, stream_of
from pp_opt.validator.context import Context
from pp_opt.validator.memory_check import peak_levels
from pp_opt.validator.violation import Violation


def expected_metrics(ctx: Context) -> dict[str, float | list[float]]:
    """The metrics of docs/design.md §4 as the ops imply them (placed ops only)."""
    p = ctx.problem.p
    first = min(op.start for op in ctx.placed)
    makespan = max(op.end for op in ctx.placed) - first
    starts: list[list[float]] = [[] for _ in range(p)]
    ends: list[list[float]] = [[] for _ in range(p)]
    busy = [0.0] * p
    for op in ctx.placed:
        device = ctx.device_of(op)
        starts[device].append(op.start)
        ends[device].append(op.end)
        if stream_of(op.kind) is Stream.COMPUTE:
            busy[device] += op.end - op.start
    span = [max(ends[d]) - min(starts[d]) if starts[d] else 0.0 for d in range(p)]
    longest = max(span)
    return {
        "makespan": makespan,
        "span": span,
        "bubble_rate": (longest - max(busy)) / longest if longest > 0 else 0.0,
        "idle_fraction": 1.0 - sum(busy) / (p * makespan) if makespan > 0 else 0.0,
        "peak_memory": peak_levels(ctx),
        "busy": busy,
    }


def check_metrics(ctx: Context, stored: object) -> list[Violation]:
    """Each stored metric within tolerance of the recomputed one (times, memory, ratios)."""
    if not ctx.placed or len(ctx.placed) < len(ctx.ops):
        # Ops without a stage or a finite time are reported already; metrics over the
        # rest would differ from the stored ones for that reason alone.
        return []
    expected = expected_metrics(ctx)
    tolerance = {
        "makespan": ctx.time_tol,
        "span": ctx.time_tol,
        "busy": ctx.time_tol,
        "peak_memory": ctx.memory_tol,
        "bubble_rate": ctx.tol * 10,
        "idle_fraction": ctx.tol * 10,
    }
    found = []
    for name, want in expected.items():
        have = getattr(stored, name, None)
        if isinstance(want, list):
            found += _compare_list(name, have, want, tolerance[name], ctx.problem.p)
        else:
            found += _compare_one(name, have, want, tolerance[name], None)
    return found


def _compare_one(
    name: str, have: object, want: float, tol: float, device: int | None
) -> list[Violation]:
    if isinstance(have, bool) or not isinstance(have, int | float):
        message = f"stored {name} is {have!r}; the ops give {want:.6g}"
        return [Violation(rule="metrics", message=message, device=device, amount=math.inf)]
    diff = abs(float(have) - want)
    if diff > tol or math.isnan(diff):
        message = f"stored {name} is {have:.6g} but the ops give {want:.6g}; recompute metrics"
        return [Violation(rule="metrics", message=message, device=device, amount=diff)]
    return []


def _compare_list(
    name: str, have: object, want: Sequence[float], tol: float, p: int
) -> list[Violation]:
    if not isinstance(have, list | tuple) or len(have) != p:
        size = len(have) if isinstance(have, list | tuple) else type(have).__name__
        message = f"stored {name} has {size} entries; give one per device ({p})"
        return [Violation(rule="metrics", message=message, amount=math.inf)]
    found = []
    for device, (h, w) in enumerate(zip(have, want, strict=True)):
        found += _compare_one(f"{name}[{device}]", h, w, tol, device)
    return found
