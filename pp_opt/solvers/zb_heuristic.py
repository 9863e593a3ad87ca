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
from collections.abc import Callable

from pp_opt.dag import build_dag
from pp_opt.errors import PPOptError
from pp_opt.ops import Stream
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, SolverInfo
from pp_opt.simulator import simulate
from pp_opt.solvers.zb_state import EPS, DeviceState, Order, OrderBuilder, Stuck
from pp_opt.solvers.zb_v_greedy import v_order

log = logging.getLogger(__name__)


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
            except (Stuck, KeyError):
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
    bld = OrderBuilder(problem, limit)
    devs = [DeviceState(d, (d,), limit[d]) for d in range(p)]

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
        while dev.memory + bld.mem(kind, j) > dev.limit + EPS:
            if dev.n(2) >= dev.n(1):
                raise Stuck
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
                while mem_with_w > dev.limit + EPS and dev.n(2) + w_cnt < dev.n(1):
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
