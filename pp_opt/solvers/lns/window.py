"""Cutting a timed schedule into the three parts of one neighbourhood: fixed, free, tail.

A window ``[a, b)`` in time splits every device's ops into

- *fixed*: ops that start before ``a`` keep their times exactly;
- *free*: ops that start in ``[a, b)`` may move and change order (CP-SAT places them);
- *tail*: the ops from the device's *cut* on keep their order: on each stream, on each
  shared host link, and across the streams of a device (the cross-stream waits of
  :func:`pp_opt.simulator.order_of`). The first of them (up to ``elastic_until``) get
  times of their own; the rest move rigidly, by one shift per device (devices that
  share a host link share one shift).

The cut ``tau(d)`` is the first start at or after ``b`` by which every earlier op of the
device has ended. Then the device has executed the same ops at its cut in the new
schedule as at ``tau(d)`` in the old one (the sub-model makes every fixed and free op of
the device end by the shifted cut), so its memory level there is the same, and after
it the tail's memory events repeat the old ones shifted: the tail fits the cap as
before and needs no memory constraint of its own. The elastic part is the same argument
as :func:`pp_opt.simulator.retime`'s: with every stream order and cross-stream wait of
the old schedule kept, each allocation still comes after every free that came before
it, so no memory level in the tail exceeds one of the old schedule's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pp_opt.ops import OpKey
from pp_opt.schedule import Schedule, ScheduledOp


@dataclass(kw_only=True, slots=True)
class Window:
    """One neighbourhood of a schedule."""

    start: float
    """``a``: ops starting earlier are fixed."""
    end: float
    """``b``: ops starting in ``[a, b)`` are free."""
    fixed: dict[OpKey, ScheduledOp] = field(default_factory=dict)
    free: dict[OpKey, ScheduledOp] = field(default_factory=dict)
    tail: dict[OpKey, ScheduledOp] = field(default_factory=dict)
    elastic: set[OpKey] = field(default_factory=set)
    """Tail ops with times of their own (the rest of the tail moves rigidly)."""
    cut: dict[int, float] = field(default_factory=dict)
    """``tau(d)`` of each device that has a tail."""
    group: dict[int, int] = field(default_factory=dict)
    """Shift group of each device: its host-link group, or a group of its own."""

    def part_of(self, key: OpKey) -> str:
        """``fixed``, ``free``, ``elastic`` (tail, own time) or ``rigid`` (tail, shifted)."""
        if key in self.free:
            return "free"
        if key in self.tail:
            return "elastic" if key in self.elastic else "rigid"
        return "fixed"


def shift_groups(schedule: Schedule) -> dict[int, int]:
    """Devices that share a host link shift together; the others alone."""
    problem = schedule.problem
    groups: dict[int, int] = {}
    for device in range(problem.p):
        link = problem.link_group(device)
        groups[device] = problem.p + link if link is not None else device
    return groups


def cut_window(
    schedule: Schedule, start: float, end: float, elastic_until: float | None = None
) -> Window:
    """The fixed, free and tail parts of ``schedule`` for the window ``[start, end)``; tail
    ops that start before ``elastic_until`` (``end`` when None) are elastic."""
    window = Window(start=start, end=end, group=shift_groups(schedule))
    elastic_until = end if elastic_until is None else elastic_until
    for device, own in enumerate(schedule.by_device()):
        latest_end = float("-inf")
        cut: float | None = None
        for op in own:  # execution order: by start
            if cut is None and op.start >= end and latest_end <= op.start + 1e-9:
                cut = op.start
            if cut is not None:
                window.tail[op.key] = op
                if op.start < elastic_until:
                    window.elastic.add(op.key)
            elif op.start < start:
                window.fixed[op.key] = op
            else:
                window.free[op.key] = op
            latest_end = max(latest_end, op.end)
        if cut is not None:
            window.cut[device] = cut
    return window
