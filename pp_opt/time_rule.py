"""The one rule for comparing times (docs/design.md §5), used by everything that reads them.

Times are checked to :data:`TIME_TOLERANCE` of the schedule's latest end: an op may
start that much before what it waits for ends, and a free that lands that much after an
allocation counts as before it. The simulator (the waits of :func:`pp_opt.simulator.order_of`
and :func:`pp_opt.simulator.align`), the validator, the metrics (peak memory) and the
exporters take the slack and the free-before-allocation rule from here, so a schedule the
validator passes never reports a peak above its cap.

Schedules handed out are aligned as well (:func:`pp_opt.simulator.align`): an op that
starts when what it waits for ends gets that end bit for bit, so reading a file needs no
tolerance at all.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable
from typing import TypeVar

from pp_opt.schedule import ScheduledOp

TIME_TOLERANCE = 1e-7
"""Relative tolerance of times: the slack is this times the latest end (at least 1)."""

Tag = TypeVar("Tag")


def time_slack(ops: Iterable[ScheduledOp], tolerance: float = TIME_TOLERANCE) -> float:
    """The absolute slack of the time rule for these ops: ``tolerance * max(1, latest time)``.

    Rounding grows with the size of the numbers, so the slack follows the largest time
    (the latest end, for schedules that start at 0). Ops with non-finite times are left out.
    """
    latest = 0.0
    for op in ops:
        for time in (op.start, op.end):
            if math.isfinite(time) and abs(time) > latest:
                latest = abs(time)
    return tolerance * max(1.0, latest)


def counts_before(free: float, allocation: float, slack: float) -> bool:
    """Whether a free at time ``free`` comes before an allocation at ``allocation``: at
    equal times frees come first, and a free up to ``slack`` later still counts as before."""
    return free <= allocation + slack


def settle_frees(
    events: Iterable[tuple[float, float, Tag]], slack: float
) -> list[tuple[float, float, Tag]]:
    """One device's memory events ``(time, delta, tag)`` in the order the rule applies them.

    A free (negative delta) that :func:`counts_before` an earlier allocation is moved back
    to the earliest such allocation; then events are sorted by time, frees first at equal
    times, and otherwise in the order given (the sort is stable). Summing the deltas in
    this order gives memory over time; its highest level is the peak the validator checks.
    """
    listed = [(time, delta, tag) for time, delta, tag in events if delta != 0]
    allocations = sorted(time for time, delta, _ in listed if delta > 0)
    settled = []
    for time, delta, tag in listed:
        if delta < 0 and allocations:
            first = bisect_left(allocations, True, key=lambda a: counts_before(time, a, slack))
            if first < len(allocations) and allocations[first] < time:
                time = allocations[first]
        settled.append((time, delta, tag))
    settled.sort(key=lambda event: (event[0], event[1] > 0))
    return settled
