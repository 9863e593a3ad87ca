"""List schedules: greedy event-driven orders, one of which always fits a feasible cap.

With caps at or above what :func:`pp_opt.bounds.device_min_memory` proves necessary, a
list schedule that lets at most ``k`` microbatches be in flight fits when ``k`` times
the per-microbatch peak fits; with ``k = 1`` and the lower stages of each device
offloaded or recomputed (the cheaper in memory), it reaches exactly that minimum
(:func:`fallback`). The memory-aware rules (:func:`greedy_bfw`, :func:`greedy_lazy_w`)
start a forward whenever memory allows, and may get stuck; :func:`greedy_bfw_limited` also caps
the microbatches in flight, at the limit that times best; :func:`greedy_bfw_older_first` keeps
room for the forwards older microbatches still owe, and never gets stuck.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import networkx as nx

from pp_opt.bounds import kept_memory
from pp_opt.dag import dag_for
from pp_opt.errors import NoOrderError
from pp_opt.ops import OpKey, OpKind, Stream, stream_of
from pp_opt.order import Order, Variant
from pp_opt.problem import Problem
from pp_opt.simulator import simulate

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


def greedy_bfw_older_first(problem: Problem) -> Order:
    """:func:`greedy_bfw` whose forwards leave room for what older microbatches still
    allocate on the device. Under a cap near one microbatch's whole activations (a deep
    pipeline, many chunks per device) a younger microbatch's forwards then run beside the
    older one's backwards instead of after them (Llama 3.1 405B on 512 H100 96 GB, tp8 pp4
    v11 m16, no checkpointing: 44492 ms for greedy-bfw, 28713 for this; bound 21580)."""
    variant = _compute_only(problem)
    dag = dag_for(problem, variant)
    rules = _Rules(priority=_BFW, k=problem.m, memory_aware=True, lazy_w=False, reserve=False,
                   older_first=True)  # fmt: skip
    streams = _ListSchedule(problem, dag, rules).run()
    if streams is None:
        raise NoOrderError("greedy-bfw-older-first", "every device is full and waiting")
    return Order(problem=problem, streams=streams, variant=variant,
                 name="greedy-bfw-older-first")  # fmt: skip


IN_FLIGHT_LIMITS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48)
"""The in-flight limits :func:`greedy_bfw_limited` tries first (then the neighbours of the
best): a geometric-ish sweep, a list schedule each."""


def greedy_bfw_limited(problem: Problem, *, deadline: float | None = None) -> Order:
    """:func:`greedy_bfw` with at most ``k`` microbatches in flight, the ``k`` that times
    best. Under a tight cap a forward taken whenever memory allows fills a device with early
    chunks and starves its later ones (or deadlocks); the limit admits microbatches at the
    rate the memory sustains (DeepSeek-V3, tp4 pp8 v2 m64, 76 GiB: 6471 -> 6297 ms)."""
    variant = _compute_only(problem)
    dag = dag_for(problem, variant)
    unlimited = _ListSchedule(problem, dag, _Rules(priority=_BFW, k=problem.m, memory_aware=True,
                                                   lazy_w=False, reserve=False))  # fmt: skip
    if unlimited.run() is not None and not unlimited.blocked:
        raise NoOrderError("greedy-bfw-limited", "the cap never holds a forward back")
    # A limit at or above the most the unlimited rule had in flight changes none of its
    # choices (stuck or not), and below the count whose whole activations fit every device
    # the cap never binds: only limits between are tried.
    top, low = unlimited.most_in_flight, max(2, in_flight_limit(problem))
    timed: dict[int, tuple[float, StreamLists]] = {}

    def attempt(k: int) -> None:
        if k in timed or not low <= k < top:
            return
        streams = _list_order(problem, dag, k, priority=_BFW, memory_aware=True)
        if streams is not None:
            order = Order(problem=problem, streams=streams, variant=variant)
            timed[k] = simulate(order, dag=dag).objective_value(), streams

    def late() -> bool:
        return deadline is not None and bool(timed) and time.perf_counter() > deadline

    for k in (low, *IN_FLIGHT_LIMITS):
        if late():
            break
        attempt(k)
    if timed and not late():
        best = min(timed, key=lambda k: timed[k][0])
        attempt(best - 1)
        attempt(best + 1)
    if not timed:
        raise NoOrderError("greedy-bfw-limited", "every in-flight limit got stuck")
    k = min(timed, key=lambda k: timed[k][0])
    return Order(problem=problem, streams=timed[k][1], variant=variant,
                 name=f"greedy-bfw-limited-k{k}", settings={"in_flight": k})  # fmt: skip


def _compute_only(problem: Problem) -> Variant:
    return Variant(split_backward=problem.split_backward, offload=False, recompute=False)


def _list_order(
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
    rules = _Rules(priority=priority or _PRIORITY, k=k, memory_aware=memory_aware,
                   lazy_w=lazy_w, reserve=reserve)  # fmt: skip
    return _ListSchedule(problem, dag, rules).run()


@dataclass(frozen=True, slots=True, kw_only=True)
class _Rules:
    """The switches of one list schedule (see :func:`_list_order`)."""

    priority: dict[OpKind, int]
    """Class of each kind among ops ready at the same time (lower first)."""
    k: int
    """Most microbatches in flight."""
    memory_aware: bool
    """A forward only when the device's activations stay under its cap."""
    lazy_w: bool
    """A ``W`` only once memory blocks the device's next forward or its forwards are done."""
    reserve: bool
    """A forward leaves room for the same microbatch's later chunks on its device."""
    older_first: bool = False
    """A forward leaves room for the forwards still owed by every older microbatch on its
    device, so the oldest microbatch in flight can always go on (no deadlock, and a younger
    one starts as soon as memory allows beside it)."""


class _ListSchedule:
    """The event loop of one list schedule: per device, ops not yet ready when it frees up
    (a heap by ready time) and ops ready by then (pools per priority class, by microbatch
    and stage); each step runs the op that can start first anywhere."""

    def __init__(self, problem: Problem, dag: nx.DiGraph, rules: _Rules) -> None:
        self.problem, self.dag, self.rules = problem, dag, rules
        p = problem.p
        self.above = {s: sum(problem.stages[t].m_b for t in problem.stages_on(problem.device_of(s))
                             if t > s) for s in range(problem.num_stages)}  # fmt: skip
        self.forwards_left = [0] * p
        for key in dag:
            if key.kind is OpKind.F:
                self.forwards_left[problem.device_of(key.stage)] += 1
        self.memory = [0.0] * p
        self.owed: list[dict[int, list[float]]] = [{} for _ in range(p)]
        """With ``older_first``: per device and microbatch, the activation bytes its forwards
        still allocate there and how many of them are left."""
        if rules.older_first:
            for key in dag:
                if key.kind is OpKind.F:
                    owed = self.owed[problem.device_of(key.stage)]
                    left = owed.setdefault(key.microbatch, [0.0, 0])
                    left[0] += float(dag.nodes[key]["mem_start"])
                    left[1] += 1
        self.room = [d.cap - d.static + 1e-9 for d in problem.devices]
        self.smallest = [min(problem.stages[s].m_b for s in problem.stages_on(d)) for d in range(p)]
        self.last_ops = Counter(key.microbatch for key in dag if key.kind is not OpKind.F)
        self.waiting = {key: dag.in_degree(key) for key in dag}
        self.ready_at: dict[OpKey, float] = {}
        self.free = [0.0] * p
        self.heaps: list[list[Any]] = [[] for _ in range(p)]
        classes = set(rules.priority.values())
        self.pools: list[dict[int, list[Any]]] = [{c: [] for c in classes} for _ in range(p)]
        self.started: set[int] = set()
        self.in_flight = 0
        self.blocked = False
        """Whether the cap ever held a forward back (with ``memory_aware``)."""
        self.most_in_flight = 0
        self.order: StreamLists = {}
        for key in dag:
            if self.waiting[key] == 0:
                self.push(key)

    def push(self, key: OpKey) -> None:
        device = self.problem.device_of(key.stage)
        item = (self.ready_at.get(key, 0.0), self.rules.priority[key.kind], key.microbatch,
                key.stage, key)  # fmt: skip
        heapq.heappush(self.heaps[device], item)

    def fits(self, key: OpKey) -> bool:
        device = self.problem.device_of(key.stage)
        extra = self.above[key.stage] if self.rules.reserve else 0.0
        if self.rules.older_first:
            extra += sum(b for mb, (b, _) in self.owed[device].items() if mb < key.microbatch)
        return (
            self.memory[device] + float(self.dag.nodes[key]["mem_start"]) + extra
            <= self.room[device]
        )

    def admissible(self, key: OpKey) -> bool:
        device = self.problem.device_of(key.stage)
        rules = self.rules
        if key.kind is OpKind.F and rules.memory_aware and not self.fits(key):
            self.blocked = True
            return False
        if key.kind is OpKind.W and rules.lazy_w and self.forwards_left[device] > 0:
            return self.memory[device] + self.smallest[device] > self.room[device]
        first = key.stage == 0 and key.kind is OpKind.F and key.microbatch not in self.started
        return not first or self.in_flight < rules.k

    def first_admissible(self, heap: list[Item]) -> Item | None:
        popped, found = [], None
        while heap:
            popped.append(heapq.heappop(heap))
            if self.admissible(popped[-1][-1]):
                found = popped[-1]
                break
        for it in popped:
            heapq.heappush(heap, it)
        return found

    def best_of(self, device: int) -> Choice | None:
        """The device's next op: the best ready class by the time it is free, else the
        earliest to become ready (ties by microbatch, then stage)."""
        heap, pool, free = self.heaps[device], self.pools[device], self.free[device]
        while heap and heap[0][0] <= free:
            ready, cls, mb, stage, key = heapq.heappop(heap)
            heapq.heappush(pool[cls], (mb, stage, ready, key))
        for cls in sorted(pool):
            item = self.first_admissible(pool[cls])
            if item is not None:
                return (free, cls), device, (pool[cls], item)
        item = self.first_admissible(heap)
        if item is None:
            return None
        return (item[0], item[1]), device, (heap, item)

    def run(self) -> StreamLists | None:
        """Every op in turn; None when stuck (only with ``memory_aware``: ``k >= 1`` alone
        always progresses)."""
        # A device's best op only changes when something happens on it: cache the rest.
        cache: dict[int, Choice | None] = {}
        dirty = set(range(self.problem.p))
        first_device = self.problem.device_of(0)
        for _ in range(self.dag.number_of_nodes()):
            for device in dirty:
                cache[device] = self.best_of(device)
            dirty.clear()
            options = [c for c in cache.values() if c is not None]
            if not options:
                return None
            (start, _), device, (where, chosen) = min(options, key=lambda c: (c[0], c[1]))
            where.remove(chosen)
            heapq.heapify(where)
            dirty.update((device, first_device))
            dirty.update(self.run_op(chosen[-1], device, start))
        return self.order

    def run_op(self, key: OpKey, device: int, start: float) -> set[int]:
        """Run ``key`` on ``device`` from ``start``; the devices of the ops it made ready."""
        nodes = self.dag.nodes
        if key.kind is OpKind.F:
            self.forwards_left[device] -= 1
            left = self.owed[device].get(key.microbatch)
            if left is not None:  # with older_first
                left[0] -= float(nodes[key]["mem_start"])
                left[1] -= 1
                if left[1] == 0:
                    del self.owed[device][key.microbatch]
            if key.stage == 0:
                self.started.add(key.microbatch)
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.memory[device] += nodes[key]["mem_start"] + nodes[key]["mem_end"]
        finish = start + nodes[key]["duration"]
        self.free[device] = finish
        self.order.setdefault((device, stream_of(key.kind)), []).append(key)
        if key.kind is not OpKind.F:
            self.last_ops[key.microbatch] -= 1
            if self.last_ops[key.microbatch] == 0:
                self.in_flight -= 1
        touched = set()
        for w in self.dag.successors(key):
            arrival = finish + self.dag.edges[key, w]["latency"]
            self.ready_at[w] = max(self.ready_at.get(w, 0.0), arrival)
            self.waiting[w] -= 1
            if self.waiting[w] == 0:
                self.push(w)
                touched.add(self.problem.device_of(w.stage))
        return touched


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
