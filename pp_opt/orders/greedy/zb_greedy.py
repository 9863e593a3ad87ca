"""The Zero Bubble paper's cost-aware greedy scheduler for ``loop`` (one stage per device).

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), Section 3.1, and their public
scheduler (``auto_schedule.py``): in warm-up each device starts as many forwards as
memory allows and as fit before the first backward can reach it; then forwards and
backwards alternate, a ``W`` fills each wait on a neighbour that it fits in (or that is
larger than the worst bubble so far), and ``W`` ops are forced in whenever memory blocks
the next ``F`` or ``B``. The ``v`` placement's greedy is :mod:`.zb_v_greedy`.

The rule takes a few switches and a memory limit (the cap, or a little under it: the
paper tunes how many forwards warm up; here also by a few more warm-up forwards on the
first device, which trade its wait for the first backward against a small delay);
:func:`zb_greedy` tries every setting (:mod:`.zb_tune`). The times the rule tracks are
only for its decisions: the simulator re-times the resulting per-device orders.
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


def zb_greedy(problem: Problem, *, deadline: float | None = None) -> Order:
    """The Zero Bubble paper's cost-aware greedy on ``loop``, one stage per device, tuned.

    Every setting of :func:`loop_settings` runs (until ``deadline``, a
    ``time.perf_counter()`` value); the best that fits the caps is returned
    (:func:`pp_opt.orders.greedy.zb_tune.best_order`). Raises :class:`NoOrderError` for a
    fused backward, another shape, or when every setting gets stuck under the caps.
    """
    require_split_backward(problem, "zb-greedy")
    if not is_loop(problem):
        raise NoOrderError("zb-greedy", "needs one stage per device, stage s on device s")
    return best_order(
        problem, loop_order, loop_settings(), generator="zb-greedy", deadline=deadline
    )


def is_loop(problem: Problem) -> bool:
    return problem.num_stages == problem.p and all(
        problem.device_of(s) == s for s in range(problem.p)
    )


def loop_settings() -> list[Setting]:
    """The paper's three switches, and 0-2 more warm-up forwards on the first device."""
    out: list[Setting] = []
    for flags in itertools.product((True, False), repeat=3):
        for bonus in range(3):
            name = f"zb-auto{''.join('1' if f else '0' for f in flags)}+{bonus}"
            out.append((name, (*flags, bonus)))
    return out


def loop_order(
    problem: Problem,
    limit: list[float],
    allow_bubble_before_first_b: bool = False,
    prioritize_b: bool = False,
    no_bubble_greedy: bool = True,
    bonus: int = 0,
) -> tuple[StreamLists, float]:
    """The Zero Bubble automatic scheduler's greedy order, one stage per device (``loop``),
    and its longest device span."""
    rule = _LoopRule(problem, limit, prioritize_b=prioritize_b,
                     no_bubble_greedy=no_bubble_greedy)  # fmt: skip
    rule.warm_up(allow_bubble_before_first_b, bonus)
    for i in range(1, problem.m):
        rule.steady_round(i)
    return rule.finish()


class _LoopRule:
    """The state of one run of the ``loop`` rule: the devices and the estimated times."""

    def __init__(
        self, problem: Problem, limit: list[float], *, prioritize_b: bool, no_bubble_greedy: bool
    ) -> None:
        self.p, self.m = problem.p, problem.m
        self.bld = OrderBuilder(problem, limit)
        self.devs = [DeviceState(d, (d,), limit[d]) for d in range(self.p)]
        self.prioritize_b = prioritize_b
        self.no_bubble_greedy = no_bubble_greedy

    def put(self, j: int, kind: int) -> None:
        dev = self.devs[j]
        after = 0.0
        if kind == 0 and j > 0:
            after = self.bld.arrival(0, j - 1, dev.n(0))
        if kind == 1 and j < self.p - 1:
            after = self.bld.arrival(1, j + 1, dev.n(1))
        if kind == 2:
            dev.pending_w.popleft()
        self.bld.put(dev, kind, j, 0, after)

    def max_bubble(self) -> float:
        return max(d.bubble for d in self.devs)

    def fill_w(self, j: int, ready: float) -> None:
        """``W`` ops that fit before ``ready``, then one more if the wait is a big bubble."""
        dev = self.devs[j]
        while dev.n(2) < dev.n(1) and dev.free + self.bld.cost(2, j) <= ready:
            self.put(j, 2)
        big = ready - dev.free > self.max_bubble() - dev.bubble
        if dev.n(2) < dev.n(1) and dev.free < ready and (big or self.no_bubble_greedy):
            self.put(j, 2)

    def make_room(self, j: int, kind: int) -> None:
        dev = self.devs[j]
        while dev.memory + self.bld.mem(kind, j) > dev.limit + EPS:
            if dev.n(2) >= dev.n(1):
                raise Stuck
            self.put(j, 2)

    def warm_up(self, allow_bubble_before_first_b: bool, bonus: int) -> None:
        """The first microbatch down, then as many forwards as fit before its backward comes
        back (and memory allows), never more than the stage before; then the first
        backwards."""
        p = self.p
        for j in range(p):
            self.put(j, 0)
        extra = self._warm_up_forwards(allow_bubble_before_first_b)
        for j in range(p):
            for _ in range(extra[j] + (bonus if j == 0 else 0)):
                self.put(j, 0)
        for j in range(p - 1, -1, -1):
            self.put(j, 1)

    def _warm_up_forwards(self, allow_bubble_before_first_b: bool) -> list[int]:
        """How many more forwards each device starts before its first backward."""
        p, m, bld, devs = self.p, self.m, self.bld, self.devs
        extra = [0] * p
        last = 0.0
        for j in range(p - 1, -1, -1):
            if j == p - 1:
                last = bld.end[(0, j, 0)] + bld.cost(1, j)
                continue
            memory, busy = devs[j].memory, devs[j].free
            while devs[j].n(0) + extra[j] < m:
                delta = bld.mem(0, j)
                if memory + delta > devs[j].limit + EPS:
                    break
                if allow_bubble_before_first_b:
                    if busy + bld.cost(0, j) > last + bld.comm:
                        break
                elif busy >= last + bld.comm:
                    break
                memory += delta
                busy += bld.cost(0, j)
                extra[j] += 1
            last = max(busy, last + bld.comm) + bld.cost(1, j)
        for j in range(p):
            while (
                j > 0 and extra[j] > 0 and extra[j] >= extra[j - 1] and devs[j].n(0) + extra[j] < m
            ):
                extra[j] -= 1
        return extra

    def _wants_forward(self, j: int) -> bool:
        """Whether device ``j`` runs a forward this round (before its backward)."""
        dev, bld = self.devs[j], self.bld
        if dev.n(0) >= self.m:
            return False
        if self.prioritize_b and j + 1 < self.p and dev.n(0) >= self.devs[j + 1].n(0) + 2:
            nxt = self.devs[j + 1]
            next_fb = nxt.free + bld.cost(0, j + 1) + bld.cost(1, j + 1) + bld.comm
            if dev.free >= next_fb:
                return False
            w_cost, w_cnt, mem_with_w = 0.0, 0, dev.memory + bld.mem(0, j)
            while mem_with_w > dev.limit + EPS and dev.n(2) + w_cnt < dev.n(1):
                w_cost += bld.cost(2, j)
                mem_with_w += bld.mem(2, j)
                w_cnt += 1
            if dev.free + bld.cost(0, j) + w_cost <= next_fb:
                return True
            if next_fb - dev.free <= self.max_bubble() - dev.bubble:
                return False
        return True

    def steady_round(self, i: int) -> None:
        """Steady state and cool-down: one forward (where useful) and one backward per round."""
        p, devs = self.p, self.devs
        wanted = [1 if self._wants_forward(j) else 0 for j in range(p)]
        for j in range(p - 2, -1, -1):
            wanted[j] = min(wanted[j], wanted[j + 1])
        for j in range(p):
            if wanted[j]:
                self.make_room(j, 0)
                if j > 0:
                    self.fill_w(j, self.bld.arrival(0, j - 1, devs[j].n(0)))
                self.put(j, 0)
        for j in range(p - 1, -1, -1):
            self.make_room(j, 1)
            if j + 1 < p:
                self.fill_w(j, self.bld.arrival(1, j + 1, i))
            if j == 0 and devs[j].n(0) == self.m:
                while devs[j].n(2) < devs[j].n(1):
                    self.put(j, 2)
            self.put(j, 1)

    def finish(self) -> tuple[StreamLists, float]:
        """The remaining ``W`` ops; the per-device orders and the longest span."""
        for j in range(self.p):
            while self.devs[j].n(2) < self.m:
                self.put(j, 2)
        devs = self.devs
        return {(d.device, Stream.COMPUTE): d.ops for d in devs}, max(d.span() for d in devs)
