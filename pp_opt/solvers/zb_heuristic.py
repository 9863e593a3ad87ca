"""The Zero Bubble paper's cost-aware greedy schedulers, as warm starts.

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), Section 3.1 and 6, and
their public scheduler (``auto_schedule.py`` and ``v_schedule.py``). Two shapes:

- ``loop`` placement with one stage per device (:func:`loop_order`): in warm-up each
  device starts as many forwards as memory allows and as fit before the first
  backward can reach it; then forwards and backwards alternate, a ``W`` fills each
  wait on a neighbour that it fits in (or that is larger than the worst bubble so
  far), and ``W`` ops are forced in whenever memory blocks the next ``F`` or ``B``.
- ``v`` placement with two chunks (:func:`v_order`): the ZB-V greedy, which starts
  chunk-0 forwards down and chunk-1 forwards back up, then runs rounds of backwards
  (the chunk whose gradient has arrived first) and forwards, with the same ``W``
  filling; a second pass lets devices with little bubble wait to spare the others.

Each rule takes a few switches and a memory limit (the cap, or a little under it:
the paper tunes how many forwards warm up; here also by a few more warm-up forwards
on the first device, which trade its wait for the first backward against a small
delay); :func:`zb_candidates` simulates every
setting with :func:`~pp_opt.simulator.simulate` and keeps those that fit the caps.
The times the rules track are only for their decisions: the simulator re-times
the resulting per-device orders.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable

from pp_opt.dag import build_dag
from pp_opt.errors import PPOptError
from pp_opt.ops import OpKey, OpKind, Stream
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, SolverInfo
from pp_opt.simulator import simulate

log = logging.getLogger(__name__)

KINDS = (OpKind.F, OpKind.B, OpKind.W)
Order = dict[tuple[int, Stream], list[OpKey]]
_EPS = 1e-9


class _Stuck(Exception):
    """A rule cannot go on under its memory limit (that setting yields nothing)."""


def zb_candidates(problem: Problem, keep: int = 2) -> list[tuple[str, Schedule]]:
    """Zero-Bubble greedy schedules of ``problem`` that fit its caps, best span first.

    Every setting is tried; the ``keep`` with the shortest estimated span are simulated.
    Empty for shapes the rules do not cover (fused backward, more chunks, other
    placements) and when every setting gets stuck under the caps.
    """
    if not problem.split_backward:
        return []
    rule: Callable[..., tuple[Order, float]]
    if _is_loop(problem):
        rule, settings = loop_order, _loop_settings()
    elif _is_v(problem):
        rule, settings = v_order, _v_settings()
    else:
        return []
    tried: dict[tuple, tuple[float, str, Order]] = {}
    for limit in _limits(problem):
        for name, flags in settings:
            try:
                order, span = rule(problem, limit, *flags)
            except (_Stuck, KeyError):
                continue
            signature = tuple(tuple(keys) for keys in order.values())
            tried.setdefault(signature, (span, f"{name}@{limit[0]:g}", order))
    # The rules time their orders as the simulator does: simulate only the best few.
    dag = build_dag(problem, offload=False, recompute=False)
    out: list[tuple[str, Schedule]] = []
    for _, name, order in sorted(tried.values(), key=lambda t: t[0])[:keep]:
        try:
            schedule = simulate(problem, order, dag=dag, solver=_info(name))
        except PPOptError as err:
            log.debug("zb heuristic %s skipped: %s", name, err)
            continue
        if _fits(problem, schedule):
            out.append((name, schedule))
    return sorted(out, key=lambda c: max(c[1].metrics.span))


def _is_loop(problem: Problem) -> bool:
    return problem.num_stages == problem.p and all(
        problem.device_of(s) == s for s in range(problem.p)
    )


def _is_v(problem: Problem) -> bool:
    p = problem.p
    return problem.num_stages == 2 * p and all(
        problem.device_of(s) == s and problem.device_of(2 * p - 1 - s) == s for s in range(p)
    )


def _limits(problem: Problem) -> list[list[float]]:
    """Activation limits per device: the full room, then one activation less."""
    room = [d.cap - d.static for d in problem.devices]
    one = [max(problem.stages[s].m_b for s in problem.stages_on(d)) for d in range(problem.p)]
    return [[r - k * a for r, a in zip(room, one, strict=True)] for k in range(2)]


def _loop_settings() -> list[tuple[str, tuple]]:
    """The paper's three switches, and 0-2 more warm-up forwards on the first device."""
    out: list[tuple[str, tuple]] = []
    for flags in itertools.product((True, False), repeat=3):
        for bonus in range(3):
            name = f"zb-auto{''.join('1' if f else '0' for f in flags)}+{bonus}"
            out.append((name, (*flags, bonus)))
    return out


def _v_settings() -> list[tuple[str, tuple]]:
    return [
        (f"zb-v-greedy{''.join('1' if f else '0' for f in flags)}", flags)
        for flags in itertools.product((True, False), repeat=2)
    ]


def _info(name: str) -> SolverInfo:
    return SolverInfo(name="zb-heuristic", status="heuristic", objective=0.0, extra={"how": name})


def _fits(problem: Problem, schedule: Schedule) -> bool:
    return all(
        peak <= d.cap + 1e-6
        for peak, d in zip(schedule.metrics.peak_memory, problem.devices, strict=True)
    )


class _Device:
    """One device's state while a rule builds its order: counts, memory, time, bubble."""

    def __init__(self, device: int, stages: tuple[int, ...], limit: float) -> None:
        self.device = device
        self.stages = stages  # per "lane" (one per (kind, chunk) stream of microbatches)
        self.limit = limit
        self.count: dict[tuple[int, int], int] = {}
        self.memory = 0.0
        self.free = 0.0
        self.bubble = 0.0
        self.ops: list[OpKey] = []
        self.pending_w: deque[tuple[int, int]] = deque()  # (lane, microbatch)
        self.start = 0.0

    def span(self) -> float:
        return self.free - self.start

    def n(self, kind: int, lane: int = 0) -> int:
        return self.count.get((kind, lane), 0)


class _Builder:
    """Shared bookkeeping of both rules: estimated end times and the ``put`` step."""

    def __init__(self, problem: Problem, limit: list[float]) -> None:
        self.problem = problem
        self.comm = problem.t_comm
        self.end: dict[tuple[int, int, int], float] = {}  # (kind, stage, microbatch)

    def cost(self, kind: int, stage: int) -> float:
        st = self.problem.stages[stage]
        return (st.t_f, st.t_b, st.t_w)[kind]

    def mem(self, kind: int, stage: int) -> float:
        st = self.problem.stages[stage]
        return (st.m_b, -(st.m_b - st.m_w), -st.m_w)[kind]

    def put(self, dev: _Device, kind: int, stage: int, lane: int, after: float = 0.0) -> float:
        """Append the next ``kind`` op of ``stage`` on ``dev``; ``after``: when its input is
        ready. Returns its estimated end."""
        j = dev.n(kind, lane)
        if j >= self.problem.m:
            raise _Stuck
        delta = self.mem(kind, stage)
        if delta > 0 and dev.memory + delta > dev.limit + _EPS:
            raise _Stuck
        no_bubble = dev.free + self.cost(kind, stage)
        finish = max(no_bubble, after + self.cost(kind, stage))
        if dev.n(0, 0) > 0:
            dev.bubble += finish - no_bubble
        if not dev.ops:
            dev.start = finish - self.cost(kind, stage)
        dev.free = finish
        dev.memory += delta
        self.end[(kind, stage, j)] = finish
        dev.count[(kind, lane)] = j + 1
        dev.ops.append(OpKey(KINDS[kind], stage, j))
        if kind == 1:
            dev.pending_w.append((lane, j))
        return finish

    def arrival(self, kind: int, stage: int, j: int) -> float:
        """When op ``kind`` of ``stage`` for microbatch ``j`` has its input from a neighbour."""
        return self.end[(kind, stage, j)] + self.comm


def loop_order(
    problem: Problem,
    limit: list[float],
    allow_bubble_before_first_b: bool = False,
    prioritize_b: bool = False,
    no_bubble_greedy: bool = True,
    bonus: int = 0,
) -> tuple[Order, float]:
    """The Zero Bubble automatic scheduler's greedy order, one stage per device (``loop``),
    and its longest device span."""
    p, m = problem.p, problem.m
    bld = _Builder(problem, limit)
    devs = [_Device(d, (d,), limit[d]) for d in range(p)]

    def put(j: int, kind: int) -> None:
        dev = devs[j]
        after = 0.0
        if kind == 0 and j > 0:
            after = bld.arrival(0, j - 1, dev.n(0))
        if kind == 1 and j < p - 1:
            after = bld.arrival(1, j + 1, dev.n(1))
        if kind == 2:
            dev.pending_w.popleft()
        bld.put(dev, kind, j, 0, after)

    def max_bubble() -> float:
        return max(d.bubble for d in devs)

    def fill_w(j: int, ready: float) -> None:
        """``W`` ops that fit before ``ready``, then one more if the wait is a big bubble."""
        dev = devs[j]
        while dev.n(2) < dev.n(1) and dev.free + bld.cost(2, j) <= ready:
            put(j, 2)
        big = ready - dev.free > max_bubble() - dev.bubble
        if dev.n(2) < dev.n(1) and dev.free < ready and (big or no_bubble_greedy):
            put(j, 2)

    def make_room(j: int, kind: int) -> None:
        dev = devs[j]
        while dev.memory + bld.mem(kind, j) > dev.limit + _EPS:
            if dev.n(2) >= dev.n(1):
                raise _Stuck
            put(j, 2)

    # Warm-up: the first microbatch down, then as many forwards as fit before its
    # backward comes back (and memory allows), never more than the stage before.
    for j in range(p):
        put(j, 0)
    extra = [0] * p
    last = 0.0
    for j in range(p - 1, -1, -1):
        if j == p - 1:
            last = bld.end[(0, j, 0)] + bld.cost(1, j)
            continue
        memory, busy = devs[j].memory, devs[j].free
        while devs[j].n(0) + extra[j] < m:
            delta = bld.mem(0, j)
            if memory + delta > devs[j].limit + _EPS:
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
        while j > 0 and extra[j] > 0 and extra[j] >= extra[j - 1] and devs[j].n(0) + extra[j] < m:
            extra[j] -= 1
    for j in range(p):
        for _ in range(extra[j] + (bonus if j == 0 else 0)):
            put(j, 0)
    for j in range(p - 1, -1, -1):
        put(j, 1)
    # Steady state and cool-down: one forward (where useful) and one backward per round.
    for i in range(1, m):
        wanted = [0] * p
        for j in range(p):
            dev = devs[j]
            if dev.n(0) >= m:
                continue
            if prioritize_b and j + 1 < p and dev.n(0) >= devs[j + 1].n(0) + 2:
                nxt = devs[j + 1]
                next_fb = nxt.free + bld.cost(0, j + 1) + bld.cost(1, j + 1) + bld.comm
                if dev.free >= next_fb:
                    continue
                w_cost, w_cnt, mem_with_w = 0.0, 0, dev.memory + bld.mem(0, j)
                while mem_with_w > dev.limit + _EPS and dev.n(2) + w_cnt < dev.n(1):
                    w_cost += bld.cost(2, j)
                    mem_with_w += bld.mem(2, j)
                    w_cnt += 1
                if dev.free + bld.cost(0, j) + w_cost <= next_fb:
                    wanted[j] = 1
                    continue
                if next_fb - dev.free <= max_bubble() - dev.bubble:
                    continue
            wanted[j] = 1
        for j in range(p - 2, -1, -1):
            wanted[j] = min(wanted[j], wanted[j + 1])
        for j in range(p):
            if wanted[j]:
                make_room(j, 0)
                if j > 0:
                    fill_w(j, bld.arrival(0, j - 1, devs[j].n(0)))
                put(j, 0)
        for j in range(p - 1, -1, -1):
            make_room(j, 1)
            if j + 1 < p:
                fill_w(j, bld.arrival(1, j + 1, i))
            if j == 0 and devs[j].n(0) == m:
                while devs[j].n(2) < devs[j].n(1):
                    put(j, 2)
            put(j, 1)
    for j in range(p):
        while devs[j].n(2) < m:
            put(j, 2)
    return {(d.device, Stream.COMPUTE): d.ops for d in devs}, max(d.span() for d in devs)


def v_order(
    problem: Problem,
    limit: list[float],
    fill_f: bool = True,
    fill_b: bool = True,
    approved: list[float] | None = None,
) -> tuple[Order, float]:
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
) -> tuple[Order, list[float], float]:
    """A pass, then (while it lowers the worst bubble) passes that let the devices with
    less bubble than the worst wait, up to ``depth`` times."""
    order, bubble, span = _v_pass(problem, limit, fill_f, fill_b, approved)
    if depth > 0 and (approved is None or max(bubble) < max(approved)):
        try:
            again = _v_search(problem, limit, fill_f, fill_b, bubble, depth - 1)
        except (_Stuck, KeyError):
            return order, bubble, span
        if max(again[1]) < max(bubble):
            return again
    return order, bubble, span


def _v_pass(  # noqa: C901 - one greedy pass, kept close to the paper's
    problem: Problem,
    limit: list[float],
    fill_f: bool,
    fill_b: bool,
    approved: list[float] | None,
) -> tuple[Order, list[float], float]:
    p, m = problem.p, problem.m
    bld = _Builder(problem, limit)
    devs = [_Device(d, (d, 2 * p - 1 - d), limit[d]) for d in range(p)]
    approved = approved or [-1.0] * p
    top_approved = max(approved)

    def stage(d: int, kind: int, lane: int) -> int:
        chunk = lane if kind == 0 else 1 - lane
        return devs[d].stages[chunk]

    def put(d: int, kind: int, lane: int) -> None:
        dev = devs[d]
        j = dev.n(kind, lane)
        after = 0.0
        if kind < 2 and lane == 1 and d < p - 1:
            after = bld.arrival(kind, stage(d + 1, kind, 1), j)
        if kind < 2 and lane == 0 and d > 0:
            after = bld.arrival(kind, stage(d - 1, kind, 0), j)
        bld.put(dev, kind, stage(d, kind, lane), lane, after)

    def put_w(d: int) -> None:
        if not devs[d].pending_w:
            raise _Stuck
        lane, _ = devs[d].pending_w.popleft()
        put(d, 2, lane)

    def max_bubble(d: int = -1) -> float:
        worst = max(dev.bubble for dev in devs)
        return max(worst, top_approved - approved[d]) if d >= 0 else worst

    def source_end(d: int, kind: int, lane: int) -> float | None:
        """Estimated end of the op feeding ``d``'s next (kind, lane) op, if placed."""
        j = devs[d].n(kind, lane)
        if lane == 1 and d < p - 1:
            return bld.end.get((kind, stage(d + 1, kind, 1), j))
        if lane == 0 and d > 0:
            return bld.end.get((kind, stage(d - 1, kind, 0), j))
        return None

    def fill(d: int, kind: int, lane: int, flag: bool) -> None:
        dev = devs[d]
        ready = source_end(d, kind, lane)
        if ready is None:
            return
        ready += bld.comm
        while dev.pending_w and ready >= dev.free + bld.cost(2, stage(d, 2, dev.pending_w[0][0])):
            put_w(d)
        if dev.pending_w and ready - dev.free > max_bubble(d) - dev.bubble and flag:
            put_w(d)

    def f_mem(d: int, lane: int) -> float:
        return bld.mem(0, stage(d, 0, lane))

    # Warm-up: chunk-0 forwards down; going back up, each device adds forwards (and
    # those of all devices above it) while memory and the returning wave allow.
    for d in range(p):
        put(d, 0, 0)
    for d in range(p - 1, -1, -1):
        if d == p - 1:
            put(d, 0, 1)
            continue
        ready = bld.end[(0, stage(d + 1, 0, 1), 0)] + bld.comm
        dev = devs[d]
        while (
            dev.memory + f_mem(d, 0) * (2 + 2 * d) <= dev.limit + _EPS
            and dev.free + bld.cost(0, stage(d, 0, 0)) <= ready
            and dev.n(0, 0) < m
        ):
            for e in range(d + 1):
                put(e, 0, 0)
        put(d, 0, 1)
    lane = 0
    for d in range(1, p):
        prev, dev = devs[d - 1], devs[d]
        while (dev.n(0, 0) + dev.n(0, 1) < prev.n(0, 0) + prev.n(0, 1)
               or dev.n(0, 1) <= prev.n(0, 1) < m):  # fmt: skip
            for e in range(p - 1, d - 1, -1):
                if devs[e].n(0, lane) < m:
                    put(e, 0, lane)
            lane = 1 - lane
    # Rounds: a backward on every device (the lane whose gradient arrives first), then
    # a forward where one is ready; W ops fill waits and make room.
    for _ in range(2 * m):
        for d in range(p):
            while devs[d].memory + bld.mem(1, stage(d, 1, 0)) > devs[d].limit + _EPS:
                put_w(d)
        b0, b1 = [], []
        for d in range(p):
            dev = devs[d]
            if dev.n(1, 1) >= dev.n(1, 0):
                b0.append(d)
            elif d == p - 1 or dev.n(1, 0) >= m or (1, stage(d + 1, 1, 1), dev.n(1, 1)) in bld.end:
                b1.append(d)
            else:
                b0.append(d)
        for d, b_lane in [(d, 1) for d in reversed(b1)] + [(d, 0) for d in b0]:
            fill(d, 1, b_lane, b_lane == 1 or fill_b)
            put(d, 1, b_lane)
        for d in range(p):
            dev = devs[d]
            if dev.n(0, 1) >= m:
                continue
            f_lane = None
            if dev.n(0, 1) >= dev.n(0, 0):
                f_lane = 0
            elif d == p - 1 or (0, stage(d + 1, 0, 1), dev.n(0, 1)) in bld.end:
                f_lane = 1
            elif dev.n(0, 0) < m and (d == 0 or (0, d - 1, dev.n(0, 0)) in bld.end):
                f_lane = 0
            if f_lane is None:
                continue
            while dev.memory + f_mem(d, f_lane) > dev.limit + _EPS:
                put_w(d)
            fill(d, 0, f_lane, fill_f)
            put(d, 0, f_lane)
    for d in range(p):
        while devs[d].pending_w:
            put_w(d)
    order = {(dev.device, Stream.COMPUTE): dev.ops for dev in devs}
    return order, [dev.bubble for dev in devs], max(dev.span() for dev in devs)
