"""List schedules: greedy event-driven orders, one of which always fits a feasible cap.

With caps at or above what :func:`pp_opt.bounds.device_min_memory` proves necessary, a
list schedule that lets at most ``k`` microbatches be in flight fits when ``k`` times
the per-microbatch peak fits; with ``k = 1`` and the lower stages of each device
offloaded or recomputed (the cheaper in memory), it reaches exactly that minimum
(:func:`fallback`). The memory-aware rules (:func:`greedy_bfw`, :func:`greedy_lazy_w`)
start a forward whenever memory allows, and may get stuck.
"""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Any

import networkx as nx

from pp_opt.bounds import kept_memory
from pp_opt.dag import dag_for
from pp_opt.errors import NoOrderError
from pp_opt.ops import OpKey, OpKind, Stream, stream_of
from pp_opt.order import Order, Variant
from pp_opt.problem import Problem

_PRIORITY = {OpKind.B: 0, OpKind.BW: 0, OpKind.R: 0, OpKind.W: 1, OpKind.F: 2}
_BFW = {OpKind.B: 0, OpKind.BW: 0, OpKind.F: 1, OpKind.W: 2}

StreamLists = dict[tuple[int, Stream], list[OpKey]]
Item = tuple[Any, ...]
"""A heap entry: ``(ready, class, microbatch, stage, key)`` or, in a ready pool,
``(microbatch, stage, ready, key)``; the op key is always last."""
Choice = tuple[tuple[float, int], int, tuple[list[Item], Item]]
"""A device's next op: ``((start, class), device, (its heap or pool, its entry))``."""


def in_flight_limit(problem: Problem) -> int:
    """Most microbatches in flight such that each device's activations fit its cap."""
    limit = problem.m
    for device in range(problem.p):
        one = sum(problem.stages[s].m_b for s in problem.stages_on(device))
        room = problem.devices[device].cap - problem.devices[device].static
        limit = min(limit, int(room / one + 1e-9) if one > 0 else problem.m)
    return limit


def fallback(problem: Problem, *, fraction: float = 1.0) -> Order:
    """A valid order under the caps whenever the caps admit any schedule.

    At most ``k`` microbatches in flight (the most that fit); when not even one fits,
    one microbatch at a time with the lower stages of each device offloaded (moving
    ``fraction`` of each activation) or recomputed. Raises :class:`NoOrderError` when
    even that does not fit.
    """
    k = in_flight_limit(problem)
    if k >= 1:
        variant = _compute_only(problem)
        streams = _list_order(problem, dag_for(problem, variant), k)
        if streams is None:
            raise NoOrderError("fallback", "the list schedule got stuck")
        return Order(problem=problem, streams=streams, variant=variant, name="fallback")
    return _sequential_with_savings(problem, fraction)


def greedy_bfw(problem: Problem) -> Order:
    """Zero-Bubble-style list schedule: a ready backward first, then a forward while memory
    allows, then a ``W``; the rest fills what would be idle time."""
    return _greedy(problem, "greedy-bfw", lazy_w=False)


def greedy_lazy_w(problem: Problem) -> Order:
    """Like :func:`greedy_bfw`, but a ``W`` only once memory blocks the device's next forward
    or its forwards are done (the deferred ``W`` fill the drain)."""
    return _greedy(problem, "greedy-lazy-w", lazy_w=True)


def _greedy(problem: Problem, name: str, *, lazy_w: bool) -> Order:
    """A memory-aware list schedule; unlike :func:`fallback` it may deadlock (every device
    full and waiting), and then raises :class:`NoOrderError`."""
    variant = _compute_only(problem)
    dag = dag_for(problem, variant)
    # Reserving room for later chunks only matters (and only runs) when a rule is stuck.
    for reserve in (False, True) if problem.v > 1 else (False,):
        streams = _list_order(problem, dag, problem.m, priority=_BFW, memory_aware=True,
                              lazy_w=lazy_w, reserve=reserve)  # fmt: skip
        if streams is not None:
            label = name + ("-reserve" if reserve else "")
            return Order(problem=problem, streams=streams, variant=variant, name=label)
    raise NoOrderError(name, "every device is full and waiting (the rule got stuck)")


def _compute_only(problem: Problem) -> Variant:
    return Variant(split_backward=problem.split_backward, offload=False, recompute=False)


def _list_order(  # noqa: C901 - one event loop
    problem: Problem,
    dag: nx.DiGraph,
    k: int,
    *,
    priority: dict[OpKind, int] | None = None,
    memory_aware: bool = False,
    lazy_w: bool = False,
    reserve: bool = False,
) -> StreamLists | None:
    """Greedy list schedule: earliest start first, then by ``priority`` (backward, ``W``,
    forward by default); at most ``k`` microbatches in flight, and with ``memory_aware``
    a forward only when the device's activations stay under its cap; with ``lazy_w`` a
    ``W`` only once memory blocks the device's next forward or its forwards are done (the
    deferred ``W`` fill the drain, which keeps per-device spans short); with ``reserve``
    a forward leaves room for the same microbatch's later chunks on the device (so
    chunk-0 forwards cannot fill a ``v`` device and starve its chunk 1). None if stuck."""
    above = {s: sum(problem.stages[t].m_b for t in problem.stages_on(problem.device_of(s)) if t > s)
             for s in range(problem.num_stages)}  # fmt: skip
    forwards_left = [0] * problem.p
    for key in dag:
        if key.kind is OpKind.F:
            forwards_left[problem.device_of(key.stage)] += 1
    priority = priority or _PRIORITY
    memory = [0.0] * problem.p
    room = [d.cap - d.static + 1e-9 for d in problem.devices]
    last_ops = Counter(key.microbatch for key in dag if key.kind is not OpKind.F)
    waiting = {key: dag.in_degree(key) for key in dag}
    ready_at: dict[OpKey, float] = {}
    end: dict[OpKey, float] = {}
    free = [0.0] * problem.p
    # Per device: ops not yet ready when the device frees up (by ready time), and ops
    # ready by then, per priority class (by microbatch, stage).
    heaps: list[list[Any]] = [[] for _ in range(problem.p)]
    pools: list[dict[int, list[Any]]] = [{c: [] for c in set(priority.values())} for _ in heaps]
    started: set[int] = set()
    in_flight = 0
    order: dict[tuple[int, Stream], list[OpKey]] = {}

    def push(key: OpKey) -> None:
        device = problem.device_of(key.stage)
        item = (ready_at.get(key, 0.0), priority[key.kind], key.microbatch, key.stage, key)
        heapq.heappush(heaps[device], item)

    for key in dag:
        if waiting[key] == 0:
            push(key)

    smallest = [min(problem.stages[s].m_b for s in problem.stages_on(d)) for d in range(problem.p)]

    def fits(key: OpKey) -> bool:
        device = problem.device_of(key.stage)
        extra = above[key.stage] if reserve else 0.0
        return memory[device] + float(dag.nodes[key]["mem_start"]) + extra <= room[device]

    def admissible(key: OpKey) -> bool:
        device = problem.device_of(key.stage)
        if key.kind is OpKind.F and memory_aware and not fits(key):
            return False
        if key.kind is OpKind.W and lazy_w and forwards_left[device] > 0:
            return memory[device] + smallest[device] > room[device]
        first = key.stage == 0 and key.kind is OpKind.F and key.microbatch not in started
        return not first or in_flight < k

    def first_admissible(heap: list[Item]) -> Item | None:
        popped, found = [], None
        while heap:
            popped.append(heapq.heappop(heap))
            if admissible(popped[-1][-1]):
                found = popped[-1]
                break
        for it in popped:
            heapq.heappush(heap, it)
        return found

    def best_of(device: int) -> Choice | None:
        """The device's next op: the best ready class by the time it is free, else the
        earliest to become ready (ties by microbatch, then stage)."""
        heap, pool = heaps[device], pools[device]
        while heap and heap[0][0] <= free[device]:
            ready, cls, mb, stage, key = heapq.heappop(heap)
            heapq.heappush(pool[cls], (mb, stage, ready, key))
        for cls in sorted(pool):
            item = first_admissible(pool[cls])
            if item is not None:
                return (free[device], cls), device, (pool[cls], item)
        item = first_admissible(heap)
        if item is None:
            return None
        return (item[0], item[1]), device, (heap, item)

    # A device's best op only changes when something happens on it: cache the rest.
    cache: dict[int, Choice | None] = {}
    dirty = set(range(problem.p))
    first_device = problem.device_of(0)
    remaining = dag.number_of_nodes()
    while remaining:
        remaining -= 1
        for device in dirty:
            cache[device] = best_of(device)
        dirty.clear()
        options = [c for c in cache.values() if c is not None]
        if not options:
            return None  # stuck: only with memory_aware (k >= 1 alone always progresses)
        best = min(options, key=lambda c: (c[0], c[1]))
        (start, _), device, (where, chosen) = best
        where.remove(chosen)
        heapq.heapify(where)
        key = chosen[-1]
        dirty.update((device, first_device))
        if key.kind is OpKind.F:
            forwards_left[device] -= 1
        if key.stage == 0 and key.kind is OpKind.F:
            started.add(key.microbatch)
            in_flight += 1
        memory[device] += dag.nodes[key]["mem_start"] + dag.nodes[key]["mem_end"]
        finish = start + dag.nodes[key]["duration"]
        end[key], free[device] = finish, finish
        order.setdefault((device, stream_of(key.kind)), []).append(key)
        if key.kind is not OpKind.F:
            last_ops[key.microbatch] -= 1
            if last_ops[key.microbatch] == 0:
                in_flight -= 1
        for w in dag.successors(key):
            ready_at[w] = max(ready_at.get(w, 0.0), finish + dag.edges[key, w]["latency"])
            waiting[w] -= 1
            if waiting[w] == 0:
                push(w)
                dirty.add(problem.device_of(w.stage))
    return order


def _sequential_with_savings(problem: Problem, fraction: float) -> Order:
    """One microbatch at a time; the lower stages of each device offloaded or recomputed."""
    if not (problem.offload or problem.recompute):
        raise NoOrderError("fallback", "not even one microbatch fits without offload or recompute")
    order: StreamLists = {}
    waits: list[tuple[OpKey, OpKey]] = []
    fraction_of: dict[OpKey, float] = {}
    split = problem.split_backward
    for device in range(problem.p):
        stages = sorted(problem.stages_on(device))
        for j in range(problem.m):
            for i, s in enumerate(stages):
                order.setdefault((device, Stream.COMPUTE), []).append(OpKey(OpKind.F, s, j))
                if i + 1 < len(stages):
                    saving = _saving(problem, s, fraction)
                    if saving == "offload":
                        off, rel = OpKey(OpKind.OFFLOAD, s, j), OpKey(OpKind.RELOAD, s, j)
                        order.setdefault((device, Stream.D2H), []).append(off)
                        order.setdefault((device, Stream.H2D), []).append(rel)
                        fraction_of[off] = fraction_of[rel] = fraction
                        waits.append((off, OpKey(OpKind.F, stages[i + 1], j)))
                        above = stages[i + 1]
                        waits.append((OpKey(OpKind.W if split else OpKind.BW, above, j), rel))
            for i, s in reversed(list(enumerate(stages))):
                if i + 1 < len(stages) and _saving(problem, s, fraction) == "recompute":
                    order[(device, Stream.COMPUTE)].append(OpKey(OpKind.R, s, j))
                keys = [OpKey(OpKind.B, s, j), OpKey(OpKind.W, s, j)] if split else [
                    OpKey(OpKind.BW, s, j)]  # fmt: skip
                order[(device, Stream.COMPUTE)].extend(keys)
    return Order(problem=problem, streams=order, fractions=fraction_of, waits=tuple(waits),
                 variant=Variant.of_problem(problem), name="fallback")  # fmt: skip


def _saving(problem: Problem, stage: int, fraction: float) -> str:
    st = problem.stages[stage]
    best = kept_memory(problem, stage, (fraction,))
    if problem.recompute and st.m_in <= best:
        return "recompute"
    if problem.offload and best < st.m_b:
        return "offload"
    return "keep"
