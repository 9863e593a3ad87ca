"""Time bounds that follow from the memory cap: warm-up and cool-down idle under the cap,
Little's law with host-link bandwidth, the fill/empty envelope."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from pp_opt.bounds.caps import kept_memory
from pp_opt.bounds.paths import _backward_kinds, _drain, _fill, _loads, round_trip
from pp_opt.ops import OpKind, duration
from pp_opt.problem import Problem


def _device_costs(problem: Problem, device: int) -> tuple[int, float, float, float, float]:
    """``(s0, c, t_f0, t_back0, t_w0)``: the device's first stage, its work per microbatch
    (required ops), and that stage's forward, backward and ``W`` times."""
    s0 = min(problem.stages_on(device))
    kinds = (OpKind.F, *_backward_kinds(problem))
    work = sum(duration(problem, k, s) for s in problem.stages_on(device) for k in kinds)
    back = OpKind.B if problem.split_backward else OpKind.BW
    t_w0 = duration(problem, OpKind.W, s0) if problem.split_backward else 0.0
    return s0, work, duration(problem, OpKind.F, s0), duration(problem, back, s0), t_w0


def admitted_limit(problem: Problem, device: int, fractions: Sequence[float]) -> int:
    """How many microbatches can have their first-stage activation on ``device`` alive at
    once: each holds at least :func:`kept_memory` of it (``m`` when that is 0)."""
    s0 = min(problem.stages_on(device))
    kept = kept_memory(problem, s0, fractions)
    room = problem.devices[device].cap - problem.devices[device].static
    if kept <= 0:
        return problem.m
    return max(1, min(problem.m, int(room / kept + 1e-9)))


def memory_makespan(problem: Problem, fractions: Sequence[float] = (1.0,)) -> float:
    """``fill + idle_warm + F_d + B_d + max(W_d, drain)`` and the cool-down bound, per device.

    Let ``s0`` be the first stage on ``d``, ``K`` :func:`admitted_limit`, ``c`` the
    device's work per microbatch, ``w1 = c - t_back(s0) - t_w(s0)`` and ``A = t_f(s0) +
    round_trip(s0)`` (a backward of ``s0`` starts at least ``A`` after its forward). Not
    used with recompute (its ``R`` ops add work these counts leave out).

    Warm-up. Let ``tau`` be the start of the first backward of ``s0`` on ``d``, so
    ``tau >= fill(s0) + A``. Every op on ``d`` depends on its microbatch's forward of
    ``s0``, and before ``tau`` no activation of ``s0`` has been freed, so the ops run
    before ``tau`` belong to at most ``K`` microbatches and none is a backward or
    ``W`` of ``s0``: at most ``K w1`` of work, so the device idles at least
    ``idle_warm = max(0, A - K w1)`` in ``[fill, tau)``. That idle comes before the
    device's last backward, which the argument of :func:`_device_makespan` places at
    ``fill + F_d + B_d + x`` plus any idle before it: add ``idle_warm`` to that bound.

    Cool-down (``m > K``). Let ``f`` be the start of the last forward of ``s0`` on ``d``.
    Its microbatch's backward of ``s0`` ends no earlier than ``f + A + t_back(s0)``, and
    then its ``W`` and the backward chain below (``drain(s0)``). Every op of ``d`` left at
    ``f`` (besides that forward) belongs to a microbatch whose activation of ``s0`` is
    alive (at most ``c - t_f(s0)`` of work each, holding at least :func:`kept_memory`) or
    is a pending ``W`` (``t_w(s)`` of work, holding ``m_w(s)`` until it runs): all of it
    under the device's room, so at most ``t_f(s0) +`` the fractional knapsack of those
    items (:func:`_work_left`). Before ``f`` the device ran the rest, after ``fill`` and
    the warm-up idle (the ``(K+1)``-th forward of ``s0`` waited for a freed activation,
    so ``tau < f``). Hence ``makespan >= fill + idle_warm + m c - work_left + A +
    t_back(s0) + max(t_w(s0), drain(s0))``.
    """
    if problem.recompute:
        return 0.0
    best = 0.0
    for device in range(problem.p):
        s0, work, t_f0, t_back0, t_w0 = _device_costs(problem, device)
        k = admitted_limit(problem, device, fractions)
        reach = t_f0 + round_trip(problem, s0)
        idle_warm = max(0.0, reach - k * (work - t_back0 - t_w0))
        load = _loads(problem, device)
        back = OpKind.B if problem.split_backward else OpKind.BW
        fill = _fill(problem, s0)
        drain = _drain(problem, s0)
        warm = fill + idle_warm + load[OpKind.F] + load[back]
        warm += max(load.get(OpKind.W, 0.0), drain)
        best = max(best, warm)
        if problem.m > k:
            left = _work_left(problem, device, k, work - t_f0, fractions)
            busy_before = problem.m * work - t_f0 - left
            cool = fill + idle_warm + busy_before + reach + t_back0 + max(t_w0, drain)
            best = max(best, cool)
    return best


def _backward_start(problem: Problem, stage: int) -> float:
    """Earliest start of a backward of ``stage``: its forward chain, then the round trip."""
    return _fill(problem, stage) + duration(problem, OpKind.F, stage) + round_trip(problem, stage)


def turn_makespan(problem: Problem) -> float:
    """``fill + idle_first + F_d + B_d + W_d + idle_last`` per device, without offload and
    recompute: the idle a cap forces before a device's first backward and after its last
    forward, where only forwards, or only backwards, can run.

    Let ``s0`` and ``s1`` be the lowest and highest stage on ``d``. First backward: no
    memory is freed on ``d`` before its first backward (``B``/``BW`` free, ``W`` follows a
    ``B``), which starts no earlier than :func:`_backward_start` of ``s1`` (the earliest
    of its stages'). Until then only forwards run, each holding at least the smallest
    ``m_b`` of ``d``'s stages: at most ``K = room / min m_b`` of them, at most ``K``
    times the largest ``t_f`` of work. So ``d`` idles at least ``idle_first =
    backward_start(s1) - fill(s0) - K max t_f`` of ``[fill(s0), first backward)``.

    Last forward: it is some ``F(s1, j)`` (a forward of a lower stage on ``d`` is followed
    by its microbatch's ``F(s1, j)``), starting at ``f``. Its microbatch still needs the
    stages above ``s1`` and the backwards down to ``s0``, and ``W(s0, j)``: the device works
    until at least ``f + L`` with ``L = backward_start(s0) + t_back(s0) + t_w(s0) -
    fill(s1)``. The work left at ``f`` is that forward, its own backward and ``W``, and the
    backward and ``W`` of activations held at ``f`` (their forwards came earlier), under the
    room minus ``m_b(s1)``: at most ``X`` (a fractional knapsack: ``t_back + t_w`` for
    ``m_b``, ``t_w`` alone for ``m_w``). Everything else ran before ``f``, after the idle
    above (when ``d`` has more than ``K`` forwards, its first backward precedes ``f``), so
    ``makespan >= fill(s0) + idle_first + (total - x) + max(L, x)`` for the work ``x``
    left at ``f``, which is smallest at ``x = X``: ``idle_last = max(0, L - X)``.
    """
    return max(_turn_by_device(problem), default=0.0)


def device_bounds(problem: Problem) -> list[float]:
    """Per device, the larger of its turn (:func:`turn_makespan`) and envelope
    (:func:`memory_envelope`) bounds: which devices memory binds most (0 where neither
    applies)."""
    if problem.offload or problem.recompute:
        return [0.0] * problem.p
    turn = _turn_by_device(problem)
    return [max(turn[d], _device_envelope(problem, d)) for d in range(problem.p)]


def _turn_by_device(problem: Problem) -> list[float]:
    if problem.offload or problem.recompute:
        return [0.0] * problem.p
    split = problem.split_backward
    back = OpKind.B if split else OpKind.BW
    values = []
    for device in range(problem.p):
        stages = problem.stages_on(device)
        s0, s1 = min(stages), max(stages)
        room = problem.devices[device].cap - problem.devices[device].static
        t_w = {s: duration(problem, OpKind.W, s) if split else 0.0 for s in stages}
        t_back = {s: duration(problem, back, s) for s in stages}
        total = problem.m * sum(duration(problem, OpKind.F, s) + t_back[s] + t_w[s] for s in stages)
        forwards = problem.m * len(stages)
        smallest = min(problem.stages[s].m_b for s in stages)
        idle_first = 0.0
        if smallest > 0:
            k = min(forwards, int(room / smallest + 1e-9))
            if k < forwards:
                slowest = max(duration(problem, OpKind.F, s) for s in stages)
                reach = _backward_start(problem, s1) - _fill(problem, s0)
                idle_first = max(0.0, reach - k * slowest)
        tail = _backward_start(problem, s0) + t_back[s0] + t_w[s0] - _fill(problem, s1)
        left = duration(problem, OpKind.F, s1) + t_back[s1] + t_w[s1]
        items = [(t_back[s] + t_w[s], problem.stages[s].m_b) for s in stages]
        if split:
            items += [(t_w[s], problem.stages[s].m_w) for s in stages]
        free = max(0.0, room - problem.stages[s1].m_b)
        for work, memory in sorted(items, key=lambda i: -i[0] / max(i[1], 1e-300)):
            take = float(problem.m) if memory <= 0 else min(float(problem.m), free / memory)
            left += take * work
            free -= take * memory
        values.append(_fill(problem, s0) + idle_first + total + max(0.0, tail - left))
    return values


def _work_left(
    problem: Problem, device: int, k: int, per_microbatch: float, fractions: Sequence[float]
) -> float:
    """Most work a device can have left when its last first-stage forward starts: a
    fractional knapsack of microbatches in flight (``per_microbatch`` of work, at least
    :func:`kept_memory` of room each, at most ``k``) and pending ``W`` ops (``t_w`` of work,
    ``m_w`` of room each, at most ``m - 1`` per stage), under the device's room."""
    s0 = min(problem.stages_on(device))
    room = problem.devices[device].cap - problem.devices[device].static
    items = [(per_microbatch, kept_memory(problem, s0, fractions), float(k))]
    if problem.split_backward:
        for s in problem.stages_on(device):
            st = problem.stages[s]
            items.append((st.t_w, st.m_w, float(problem.m - 1)))
    total = 0.0
    for work, memory, count in sorted(items, key=lambda i: -i[0] / max(i[1], 1e-300)):
        take = count if memory <= 0 else min(count, max(0.0, room) / memory)
        total += take * work
        room -= take * memory
    return total


def _activation_area(problem: Problem, stage: int) -> float:
    """Least memory-time one kept activation of ``stage`` holds: ``m_b`` from its forward's
    start to its backward's end, and ``m_w`` for the ``W`` after it."""
    st = problem.stages[stage]
    reach = st.t_f + round_trip(problem, stage)
    if problem.split_backward:
        return (st.m_b - st.m_w) * (reach + st.t_b) + st.m_w * (reach + st.t_b + st.t_w)
    return st.m_b * (reach + st.fused_backward)


def _offload_saving(problem: Problem, stage: int) -> tuple[float, float, float]:
    """``(area saved, d2h time, h2d time)`` of offloading a whole activation of ``stage``:
    at most ``m_b`` times the round trip (it must be resident during its forward and
    backward). A fraction ``a`` saves and costs ``a`` of that at most (an upper bound on the
    saving keeps the bound valid)."""
    st = problem.stages[stage]
    return st.m_b * round_trip(problem, stage), st.t_offload, st.t_reload


def memory_area(problem: Problem, fractions: Sequence[float] = (1.0,)) -> float:
    """Little's law on each device: ``room * T >= memory-time the activations hold``.

    Over ``[0, T]`` a device holds at most ``room = cap - static`` at every moment, so the
    integral of its memory is at most ``room T``; every activation holds at least
    :func:`_activation_area` of it unless recomputed (then the bound is not used) or
    offloaded. An offload saves at most :func:`_offload_saving` and takes its copy time
    on the device's copy streams, which devices sharing a host link share: so ``T`` must
    cover the copy time that buys the missing saving, cheapest saving per second first
    (a fractional knapsack, which can only under-estimate the copies needed). The
    smallest ``T`` for which every device and link fits is found by bisection.
    """
    if problem.recompute:
        return 0.0
    need = []
    for device in range(problem.p):
        area = problem.m * sum(_activation_area(problem, s) for s in problem.stages_on(device))
        room = problem.devices[device].cap - problem.devices[device].static
        need.append((area, room))
    if not problem.offload:
        return max(area / room if room > 0 else 0.0 for area, room in need)

    savings = [  # per device, cheapest saving per second first (fixed over the bisection)
        sorted((_offload_saving(problem, s) for s in problem.stages_on(device)),
               key=lambda o: -o[0] / max(o[1], 1e-12))
        for device in range(problem.p)
    ]  # fmt: skip

    def copy_time(device: int, t: float) -> tuple[float, float]:
        area, room = need[device]
        missing = area - room * t
        d2h = h2d = 0.0
        for saving, t_off, t_rel in savings[device]:
            if missing <= 0:
                break
            if saving <= 0:
                continue
            use = min(problem.m, missing / saving)
            missing -= use * saving
            d2h += use * t_off
            h2d += use * t_rel
        return (float("inf"), float("inf")) if missing > 1e-9 else (d2h, h2d)

    def fits(t: float) -> bool:
        groups: dict[int, list[int]] = {}
        for device in range(problem.p):
            link = problem.link_group(device)
            groups.setdefault(-1 - device if link is None else link, []).append(device)
        for devices in groups.values():
            times = [copy_time(d, t) for d in devices]
            if sum(x for x, _ in times) > t or sum(y for _, y in times) > t:
                return False
        return True

    low, high = 0.0, max(area / room if room > 0 else 0.0 for area, room in need)
    if fits(low):
        return 0.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (low, mid) if fits(mid) else (mid, high)
    return low


ENVELOPE_STEPS = 512
"""Steps of the filling staircase integrated one by one; past them (a device that fills
with thousands of small activations) the line through the staircase's corners stands in."""


def memory_envelope(problem: Problem) -> float:
    """Little's law (:func:`memory_area`) with the memory a device cannot hold while it fills
    and while it empties, without offload and recompute.

    Over ``[0, T]`` device ``d`` holds ``mem(t) <= room`` of activations, and every kept
    activation holds at least :func:`_activation_area` of memory-time, so ``m * sum of the
    areas <= integral of mem``. Two more ceilings hold at every ``t``:

    - Filling: memory is allocated only when a forward starts, and nothing on ``d`` starts
      before ``fill(s0)``; forwards run one at a time, each at least the smallest ``t_f``
      of ``d``'s stages, so by ``t`` at most ``1 + (t - fill) / t_f_min`` have started,
      each allocating at most the largest ``m_b``: ``mem(t) <= h(t)``.
    - Emptying: what is held at ``t`` is freed by ``d``'s ``B``/``W`` (or ``BW``) ops that
      end in ``(t, T]``. They run one at a time; at most one started before ``t`` (it frees
      at most ``a_max``, the most one such op frees), the rest lie inside ``[t, T]``. Among those,
      every ``B`` has its ``W`` (which follows it) too, so they split into whole
      activations (``m_b`` in ``t_b + t_w``, or ``BW``) and lone ``W`` (``m_w`` in
      ``t_w``): they free at most ``r_max`` per unit of time, the better of the two rates,
      and ``mem(t) <= a_max + r_max (T - t)``.

    So ``m * sum of the areas <= integral over [0, T] of min(room, h(t), a_max + r_max (T -
    t))`` (:func:`_envelope_integral`), whose right side grows with ``T``: the smallest
    ``T`` that satisfies it, found by bisection, bounds the makespan.
    """
    if problem.offload or problem.recompute:
        return 0.0
    return max(_device_envelope(problem, device) for device in range(problem.p))


def _device_envelope(problem: Problem, device: int) -> float:
    stages = problem.stages_on(device)
    room = problem.devices[device].cap - problem.devices[device].static
    need = problem.m * sum(_activation_area(problem, s) for s in stages)
    if room <= 0 or need <= 0:
        return 0.0
    start = _fill(problem, min(stages))
    t_f = min(duration(problem, OpKind.F, s) for s in stages)
    m_b = max(problem.stages[s].m_b for s in stages)
    # (memory freed, time it takes): a whole activation (B then its W, or BW), a lone W.
    frees: list[tuple[float, float]] = []
    for s in stages:
        st = problem.stages[s]
        if problem.split_backward:
            frees += [(st.m_b, st.t_b + st.t_w), (st.m_w, st.t_w)]
        else:
            frees.append((st.m_b, duration(problem, OpKind.BW, s)))
    frees = [(a, t) for a, t in frees if a > 0]
    if t_f <= 0 or m_b <= 0 or not frees or any(t <= 0 for _, t in frees):
        return need / room
    one = [max(st.m_b - st.m_w, st.m_w) if problem.split_backward else st.m_b
           for st in (problem.stages[s] for s in stages)]  # fmt: skip
    a_max = max(one)
    r_max = max(a / t for a, t in frees)

    def held(horizon: float) -> float:
        return _envelope_integral(horizon, room=room, start=start, t_f=t_f, m_b=m_b,
                                  a_max=a_max, r_max=r_max)  # fmt: skip

    low = need / room
    high = low + start + (room / m_b + 1.0) * t_f + room / r_max + 1.0
    for _ in range(64):  # not needed: the ceilings take at most those times
        if held(high) >= need:
            break
        high *= 2.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if held(mid) < need else (low, mid)
    return low


def _envelope_integral(
    horizon: float, *, room: float, start: float, t_f: float, m_b: float, a_max: float,
    r_max: float,
) -> float:  # fmt: skip
    """``integral over [0, horizon] of min(room, h(t), a_max + r_max (horizon - t))``, with
    ``h = 0`` before ``start`` and ``m_b (1 + k)`` on ``[start + k t_f, start + (k+1) t_f)``,
    exactly: piece by piece of ``h``, each ``min(c, linear)`` integrated in closed form."""

    def piece(a: float, b: float, c: float) -> float:
        # On [a, b): min(c, e(t)) with e(t) = a_max + r_max (horizon - t), decreasing;
        # e(t) >= c for t <= knee.
        a, b = max(a, 0.0), min(b, horizon)
        if b <= a or c <= 0:
            return 0.0
        knee = horizon - (c - a_max) / r_max
        flat = max(0.0, min(b, knee) - a) * c
        lo = max(a, knee)
        if b <= lo:
            return flat
        e_lo, e_hi = a_max + r_max * (horizon - lo), a_max + r_max * (horizon - b)
        return flat + (b - lo) * (e_lo + e_hi) / 2

    total = 0.0
    for k in range(ENVELOPE_STEPS):
        a = start + k * t_f
        if a >= horizon:
            return total
        c = m_b * (1 + k)
        if c >= room:
            return total + piece(a, horizon, room)
        total += piece(a, a + t_f, c)
    # Many steps below the room (a small m_b): above the staircase lies the line through
    # its corners, h(t) <= m_b (1 + (t - start) / t_f); integrate min(room, line, e) over
    # the rest exactly, between the points where any two of them cross.
    a = start + ENVELOPE_STEPS * t_f
    if a >= horizon:
        return total

    def ceiling(t: float) -> float:
        line = m_b * (1.0 + (t - start) / t_f)
        return min(room, line, a_max + r_max * (horizon - t))

    slope = m_b / t_f
    cuts = {a, horizon, start + (room / m_b - 1.0) * t_f, horizon - (room - a_max) / r_max,
            (a_max + r_max * horizon - m_b + slope * start) / (slope + r_max)}  # fmt: skip
    points = sorted(t for t in cuts if a <= t <= horizon)
    return total + sum((hi - lo) * (ceiling(lo) + ceiling(hi)) / 2
                       for lo, hi in itertools.pairwise(points))  # fmt: skip
