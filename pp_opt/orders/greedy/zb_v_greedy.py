"""The ZB-V greedy of the Zero Bubble paper's ``v_schedule.py`` (``v`` placement, two chunks).

It starts chunk-0 forwards down and chunk-1 forwards back up, then runs rounds of
backwards (the chunk whose gradient has arrived first) and forwards, with ``W``
filling the waits; a second pass lets devices with little bubble wait to spare the
others. The fixed ZB-V pattern (PyTorch's order) is
:func:`pp_opt.orders.patterns.vshape.zb_v`; this is the cost-aware rule, tuned over its
switches like the ``loop`` one (:mod:`.zb_tune`).
"""

from __future__ import annotations

import itertools

from pp_opt.errors import NoOrderError
from pp_opt.ops import Stream
from pp_opt.order import Order
from pp_opt.orders.common import require_split_backward
from pp_opt.orders.greedy.zb_state import EPS, DeviceState, OrderBuilder, StreamLists, Stuck
from pp_opt.orders.greedy.zb_tune import Setting, best_order
from pp_opt.problem import Problem


def zb_v_greedy(problem: Problem, *, deadline: float | None = None) -> Order:
    """The ZB-V greedy on the ``v`` placement (stage s and 2p-1-s on device s), tuned.

    Raises :class:`NoOrderError` for a fused backward, another shape, or when every
    setting gets stuck under the caps.
    """
    require_split_backward(problem, "zb-v-greedy")
    if not is_v(problem):
        raise NoOrderError("zb-v-greedy", "needs the v placement with two chunks per device")
    return best_order(problem, v_order, v_settings(), generator="zb-v-greedy", deadline=deadline)


def is_v(problem: Problem) -> bool:
    p = problem.p
    return problem.num_stages == 2 * p and all(
        problem.device_of(s) == s and problem.device_of(2 * p - 1 - s) == s for s in range(p)
    )


def v_settings() -> list[Setting]:
    return [
        (f"zb-v-greedy{''.join('1' if f else '0' for f in flags)}", flags)
        for flags in itertools.product((True, False), repeat=2)
    ]


def v_order(
    problem: Problem,
    limit: list[float],
    fill_f: bool = True,
    fill_b: bool = True,
    approved: list[float] | None = None,
) -> tuple[StreamLists, float]:
    """The ZB-V greedy order (``v`` placement, two chunks) and its longest device span.

    Passes repeat while letting the less-bubbled devices wait lowers the worst bubble.

    Lanes follow the paper's code: for ``F``, lane 0 is chunk 0 (stage ``d``, going
    down) and lane 1 is chunk 1 (stage ``2p - 1 - d``, coming back up); for ``B`` and
    ``W`` lane 0 is chunk 1 and lane 1 is chunk 0, so lane 0 always flows from
    device ``d - 1`` and lane 1 from ``d + 1``.
    """
    order, _, span = _v_search(problem, limit, fill_f, fill_b, approved, depth=8)
    return order, span


def _v_search(
    problem: Problem,
    limit: list[float],
    fill_f: bool,
    fill_b: bool,
    approved: list[float] | None,
    depth: int,
) -> tuple[StreamLists, list[float], float]:
    """A pass, then (while it lowers the worst bubble) passes that let the devices with
    less bubble than the worst wait, up to ``depth`` times."""
    order, bubble, span = _v_pass(problem, limit, fill_f, fill_b, approved)
    if depth > 0 and (approved is None or max(bubble) < max(approved)):
        try:
            again = _v_search(problem, limit, fill_f, fill_b, bubble, depth - 1)
        except (Stuck, KeyError):
            return order, bubble, span
        if max(again[1]) < max(bubble):
            return again
    return order, bubble, span


def _v_pass(
    problem: Problem,
    limit: list[float],
    fill_f: bool,
    fill_b: bool,
    approved: list[float] | None,
) -> tuple[StreamLists, list[float], float]:
    """One greedy pass (kept close to the paper's): warm-up, then rounds, then the last
    ``W`` ops; the order, each device's bubble and the longest span."""
    rule = _VRule(problem, limit, approved)
    rule.warm_up()
    for _ in range(2 * problem.m):
        rule.round(fill_f, fill_b)
    return rule.finish()


class _VRule:
    """The state of one pass of the ``v`` rule: the devices and the estimated times."""

    def __init__(self, problem: Problem, limit: list[float], approved: list[float] | None) -> None:
        p = self.p = problem.p
        self.m = problem.m
        self.bld = OrderBuilder(problem, limit)
        self.devs = [DeviceState(d, (d, 2 * p - 1 - d), limit[d]) for d in range(p)]
        self.approved = approved or [-1.0] * p
        self.top_approved = max(self.approved)

    def stage(self, d: int, kind: int, lane: int) -> int:
        chunk = lane if kind == 0 else 1 - lane
        return self.devs[d].stages[chunk]

    def put(self, d: int, kind: int, lane: int) -> None:
        dev = self.devs[d]
        j = dev.n(kind, lane)
        after = 0.0
        if kind < 2 and lane == 1 and d < self.p - 1:
            after = self.bld.arrival(kind, self.stage(d + 1, kind, 1), j)
        if kind < 2 and lane == 0 and d > 0:
            after = self.bld.arrival(kind, self.stage(d - 1, kind, 0), j)
        self.bld.put(dev, kind, self.stage(d, kind, lane), lane, after)

    def put_w(self, d: int) -> None:
        if not self.devs[d].pending_w:
            raise Stuck
        lane, _ = self.devs[d].pending_w.popleft()
        self.put(d, 2, lane)

    def max_bubble(self, d: int = -1) -> float:
        worst = max(dev.bubble for dev in self.devs)
        return max(worst, self.top_approved - self.approved[d]) if d >= 0 else worst

    def source_end(self, d: int, kind: int, lane: int) -> float | None:
        """Estimated end of the op feeding ``d``'s next (kind, lane) op, if placed."""
        j = self.devs[d].n(kind, lane)
        if lane == 1 and d < self.p - 1:
            return self.bld.end.get((kind, self.stage(d + 1, kind, 1), j))
        if lane == 0 and d > 0:
            return self.bld.end.get((kind, self.stage(d - 1, kind, 0), j))
        return None

    def fill(self, d: int, kind: int, lane: int, flag: bool) -> None:
        dev, bld = self.devs[d], self.bld
        ready = self.source_end(d, kind, lane)
        if ready is None:
            return
        ready += bld.comm
        while dev.pending_w and ready >= dev.free + bld.cost(
            2, self.stage(d, 2, dev.pending_w[0][0])
        ):
            self.put_w(d)
        if dev.pending_w and ready - dev.free > self.max_bubble(d) - dev.bubble and flag:
            self.put_w(d)

    def f_mem(self, d: int, lane: int) -> float:
        return self.bld.mem(0, self.stage(d, 0, lane))

    def warm_up(self) -> None:
        """Chunk-0 forwards down; going back up, each device adds forwards (and those of
        all devices above it) while memory and the returning wave allow."""
        p, m, devs, bld = self.p, self.m, self.devs, self.bld
        for d in range(p):
            self.put(d, 0, 0)
        for d in range(p - 1, -1, -1):
            if d == p - 1:
                self.put(d, 0, 1)
                continue
            ready = bld.end[(0, self.stage(d + 1, 0, 1), 0)] + bld.comm
            dev = devs[d]
            while (
                dev.memory + self.f_mem(d, 0) * (2 + 2 * d) <= dev.limit + EPS
                and dev.free + bld.cost(0, self.stage(d, 0, 0)) <= ready
                and dev.n(0, 0) < m
            ):
                for e in range(d + 1):
                    self.put(e, 0, 0)
            self.put(d, 0, 1)
        lane = 0
        for d in range(1, p):
            prev, dev = devs[d - 1], devs[d]
            while (dev.n(0, 0) + dev.n(0, 1) < prev.n(0, 0) + prev.n(0, 1)
                   or dev.n(0, 1) <= prev.n(0, 1) < m):  # fmt: skip
                for e in range(p - 1, d - 1, -1):
                    if devs[e].n(0, lane) < m:
                        self.put(e, 0, lane)
                lane = 1 - lane

    def round(self, fill_f: bool, fill_b: bool) -> None:
        """A backward on every device (the lane whose gradient arrives first), then a
        forward where one is ready; ``W`` ops fill waits and make room."""
        p, m, devs, bld = self.p, self.m, self.devs, self.bld
        for d in range(p):
            while devs[d].memory + bld.mem(1, self.stage(d, 1, 0)) > devs[d].limit + EPS:
                self.put_w(d)
        b0, b1 = [], []
        for d in range(p):
            dev = devs[d]
            if dev.n(1, 1) >= dev.n(1, 0):
                b0.append(d)
            elif (d == p - 1 or dev.n(1, 0) >= m
                  or (1, self.stage(d + 1, 1, 1), dev.n(1, 1)) in bld.end):  # fmt: skip
                b1.append(d)
            else:
                b0.append(d)
        for d, b_lane in [(d, 1) for d in reversed(b1)] + [(d, 0) for d in b0]:
            self.fill(d, 1, b_lane, b_lane == 1 or fill_b)
            self.put(d, 1, b_lane)
        for d in range(p):
            f_lane = self._forward_lane(d)
            if f_lane is None:
                continue
            while devs[d].memory + self.f_mem(d, f_lane) > devs[d].limit + EPS:
                self.put_w(d)
            self.fill(d, 0, f_lane, fill_f)
            self.put(d, 0, f_lane)

    def _forward_lane(self, d: int) -> int | None:
        """The lane of device ``d``'s forward this round, or None (none is ready)."""
        dev, m = self.devs[d], self.m
        if dev.n(0, 1) >= m:
            return None
        if dev.n(0, 1) >= dev.n(0, 0):
            return 0
        if d == self.p - 1 or (0, self.stage(d + 1, 0, 1), dev.n(0, 1)) in self.bld.end:
            return 1
        if dev.n(0, 0) < m and (d == 0 or (0, d - 1, dev.n(0, 0)) in self.bld.end):
            return 0
        return None

    def finish(self) -> tuple[StreamLists, list[float], float]:
        """The remaining ``W`` ops; the order, each device's bubble and the longest span."""
        devs = self.devs
        for d in range(self.p):
            while devs[d].pending_w:
                self.put_w(d)
        order = {(dev.device, Stream.COMPUTE): dev.ops for dev in devs}
        return order, [dev.bubble for dev in devs], max(dev.span() for dev in devs)
