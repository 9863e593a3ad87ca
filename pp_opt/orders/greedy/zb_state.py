"""Book-keeping shared by the Zero Bubble greedy rules: per-device state and the ``put`` step.

The rules (:mod:`.zb_greedy` for ``loop``, :mod:`.zb_v_greedy` for ``v``) track
estimated times only to make their decisions; the simulator re-times their orders. They
code the kinds as ``0, 1, 2`` (``F``, ``B``, ``W``: :data:`KINDS`) and ask
:mod:`pp_opt.ops` for every duration and memory effect, once per problem (the rules run
these lookups in their inner loops).
"""

from __future__ import annotations

from collections import deque

from pp_opt.ops import OpKey, OpKind, Stream, duration, memory_delta
from pp_opt.problem import Problem

KINDS = (OpKind.F, OpKind.B, OpKind.W)
StreamLists = dict[tuple[int, Stream], list[OpKey]]
"""What a rule returns: per ``(device, compute)``, its ops in order."""
EPS = 1e-9


class Stuck(Exception):
    """A rule cannot go on under its memory limit (that setting yields nothing)."""


class DeviceState:
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


class OrderBuilder:
    """Shared bookkeeping of both rules: estimated end times and the ``put`` step."""

    def __init__(self, problem: Problem, limit: list[float]) -> None:
        self.problem = problem
        self.comm = problem.t_comm
        self.end: dict[tuple[int, int, int], float] = {}  # (kind, stage, microbatch)
        stages = range(problem.num_stages)
        self._cost = [[duration(problem, k, s) for s in stages] for k in KINDS]
        self._mem = [[sum(memory_delta(problem, k, s)) for s in stages] for k in KINDS]

    def cost(self, kind: int, stage: int) -> float:
        """How long op ``kind`` (an index of :data:`KINDS`) of ``stage`` runs."""
        return self._cost[kind][stage]

    def mem(self, kind: int, stage: int) -> float:
        """How the op changes its device's memory, start and end together."""
        return self._mem[kind][stage]

    def put(self, dev: DeviceState, kind: int, stage: int, lane: int, after: float = 0.0) -> float:
        """Append the next ``kind`` op of ``stage`` on ``dev``; ``after``: when its input is
        ready. Returns its estimated end."""
        j = dev.n(kind, lane)
        if j >= self.problem.m:
            raise Stuck
        delta = self.mem(kind, stage)
        if delta > 0 and dev.memory + delta > dev.limit + EPS:
            raise Stuck
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
