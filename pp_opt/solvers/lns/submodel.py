"""The CP-SAT model of one neighbourhood (:mod:`.window`): free ops placed, the tail retimed.

Variables: a start per free op and per elastic tail op, a shift per shift group (its
rigid tail ops move by it), a cut per device (when its tail may start), the
objective. Why a solution is a valid schedule of the whole problem:

- fixed ops keep their times, and free ops start after the fixed ops of their stream
  (or host link) end and after every DAG predecessor; free ops of a queue never
  overlap (one no-overlap per stream or shared link);
- every fixed and free op of a device ends by the device's cut, and every tail op of
  it starts after the cut, so the device has executed the same ops at its cut as the
  old schedule at its own (a free copy on a shared link ends by the cut of every
  device on the link);
- tail ops keep the old schedule's order on every stream and shared link and its
  cross-stream waits, so the tail's memory levels are bounded by the old ones (the
  argument of :func:`pp_opt.simulator.retime`, see :mod:`.window`);
- every DAG edge that touches a free or a tail op is a constraint (edges between
  rigid ops of two groups bound the difference of their shifts);
- the memory of each device is a cumulative of the lifetimes that start before its
  cut, so the level is under the cap wherever it can differ from the old schedule's.

Overlapped pairs (``FB``) stay as they are paired: a pair is one op of the sub-model, and
every DAG edge, order rule, wait and memory event of either half is the pair's.

Times are integers in the units of :func:`pp_opt.solvers.cpsat.scaling.choose_scaling`;
the caller re-times the result with exact durations and validates it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, replace

from ortools.sat.python import cp_model

from pp_opt.dag import dag_for
from pp_opt.ops import OpKey, OpKind, Stream, duration, pair_time, resource_of
from pp_opt.problem import Problem
from pp_opt.runtime_rules import runtime_chains
from pp_opt.schedule import Schedule, ScheduledOp
from pp_opt.solvers.cpsat.scaling import Scaling
from pp_opt.solvers.lifetimes import activation_events, match_lifetimes
from pp_opt.solvers.lns.window import Window
from pp_opt.solvers.process.stop import handling_signals

log = logging.getLogger(__name__)

Expr = cp_model.LinearExprT
QueueKey = tuple[str, int, Stream]
"""``("device", d, stream)`` or ``("link", group, stream)``: what runs one op at a time."""


@dataclass(kw_only=True, slots=True)
class WindowResult:
    """What one neighbourhood solve gave: the new ops and its own objective."""

    ops: tuple[ScheduledOp, ...]
    objective: float
    optimal: bool


def _duration(problem: Problem, op: ScheduledOp) -> float:
    """An op's cost: :func:`~pp_opt.ops.duration`, or a pair's :func:`~pp_opt.ops.pair_time`."""
    if op.partner is not None:
        return pair_time(problem, op.stage, op.partner.stage, op.partner.kind)
    return duration(problem, op.kind, op.stage, op.fraction)


def queue_of(problem: Problem, device: int, stream: Stream) -> QueueKey:
    """The resource an op uses: its device's stream, or its host link for shared copies."""
    return resource_of(problem, device, stream)


class _Builder:
    """Builds the sub-model; one instance per neighbourhood."""

    def __init__(
        self,
        schedule: Schedule,
        window: Window,
        scaling: Scaling,
        waits: tuple[tuple[OpKey, OpKey], ...],
    ) -> None:
        self.schedule = schedule
        self.problem = schedule.problem
        self.window = window
        self.scaling = scaling
        self.waits = waits
        self.model = cp_model.CpModel()
        self.ops = {op.key: op for op in schedule.ops}
        self.size = {key: scaling.t(_duration(self.problem, op)) for key, op in self.ops.items()}
        self.alias = {half.key: op.key for op in schedule.ops if op.partner
                      for half in op.halves()}  # fmt: skip
        """Each half of a pair (and a pair's F key, as orders name it): the pair's key."""
        self.start0 = {key: scaling.t(op.start) for key, op in self.ops.items()}
        self.top = max(self.start0[k] + self.size[k] for k in self.ops) + 1
        self.start: dict[OpKey, cp_model.IntVar] = {}
        self.shift: dict[int, cp_model.IntVar] = {}
        self.cut: dict[int, cp_model.IntVar] = {}
        self.earliest: dict[int, int] = {}
        """Per device with free ops, no free op of it can start earlier than this."""

    def device(self, key: OpKey) -> int:
        return self.problem.device_of(key.stage)

    def part(self, key: OpKey) -> str:
        return self.window.part_of(key)

    def start_of(self, key: OpKey) -> Expr:
        if key in self.start:
            return self.start[key]
        if key in self.window.tail:
            return self.start0[key] + self.shift[self.window.group[self.device(key)]]
        return self.start0[key]

    def end_of(self, key: OpKey) -> Expr:
        return self.start_of(key) + self.size[key]

    def variables(self) -> None:
        horizon = 4 * self.top
        for key in self.window.free:
            self.start[key] = self.model.new_int_var(0, horizon, f"s_{key}")
        for key in self.window.elastic:
            self.start[key] = self.model.new_int_var(0, horizon, f"e_{key}")
        for device in self.window.cut:
            self.cut[device] = self.model.new_int_var(0, horizon, f"cut_{device}")
            group = self.window.group[device]
            if group not in self.shift:
                self.shift[group] = self.model.new_int_var(-self.top, horizon, f"d_{group}")

    def free_ops(self) -> None:
        """Free ops after the fixed ops of their queue, one at a time, before the cuts."""
        p = self.problem
        fixed_end: dict[QueueKey, int] = defaultdict(int)
        latest: dict[int, int] = defaultdict(int)
        for key, op in self.window.fixed.items():
            end = self.start0[key] + self.size[key]
            q = queue_of(p, self.device(key), op.stream)
            fixed_end[q] = max(fixed_end[q], end)
            latest[self.device(key)] = max(latest[self.device(key)], end)
        for device, cut in self.cut.items():
            self.model.add(cut >= latest[device])
        intervals: dict[QueueKey, list[cp_model.IntervalVar]] = defaultdict(list)
        for key, op in self.window.free.items():
            q = queue_of(p, self.device(key), op.stream)
            self.model.add(self.start[key] >= fixed_end[q])
            device = self.device(key)
            self.earliest[device] = min(self.earliest.get(device, fixed_end[q]), fixed_end[q])
            intervals[q].append(
                self.model.new_fixed_size_interval_var(self.start[key], self.size[key], f"i_{key}")
            )
            for other in self._sharing(key, op.stream):
                if other in self.cut:
                    self.model.add(self.end_of(key) <= self.cut[other])
        for queue in intervals.values():
            if len(queue) > 1:
                self.model.add_no_overlap(queue)

    def _sharing(self, key: OpKey, stream: Stream) -> list[int]:
        """Devices whose tails an op must end before: its own, and its link's for copies."""
        device = self.device(key)
        kind, owner, _ = resource_of(self.problem, device, stream)
        return [device] if kind == "device" else list(self.problem.host_links[owner])

    def tail_order(self) -> None:
        """Tail ops after their device's cut, in the old order of every stream and link."""
        p, window = self.problem, self.window
        queues: dict[QueueKey, list[ScheduledOp]] = defaultdict(list)
        for op in window.tail.values():
            queues[queue_of(p, self.device(op.key), op.stream)].append(op)
        for ops in queues.values():
            ops.sort(key=lambda op: (op.start, op.end))
            for device in {self.device(op.key) for op in ops}:
                mine = next(op.key for op in ops if self.device(op.key) == device)
                self.model.add(self.start_of(mine) >= self.cut[device])
            for before, after in zip(ops, ops[1:], strict=False):
                self._keep_before(before.key, after.key, 0)
        for u, w in self.waits:
            u, w = self.alias.get(u, u), self.alias.get(w, w)
            if u in window.tail and w in window.tail:
                self._keep_before(u, w, 0)

    def _keep_before(self, u: OpKey, w: OpKey, latency: int) -> None:
        """``w`` starts no earlier than ``u`` ends plus ``latency`` (tail or free ops)."""
        pu, pw = self.part(u), self.part(w)
        if pu == "rigid" and pw == "rigid":
            gu, gw = self.window.group[self.device(u)], self.window.group[self.device(w)]
            if gu == gw:
                return  # they move together: the old schedule already orders them
            slack = self.start0[w] - self.start0[u] - self.size[u] - latency
            key = (gu, gw)
            self.gap[key] = min(self.gap.get(key, slack), slack)
            return
        self.model.add(self.end_of(u) + latency <= self.start_of(w))

    def precedences(self) -> None:
        """Every DAG edge, and the runtime's order rules (:mod:`pp_opt.runtime_rules`)."""
        dag = dag_for(self.problem, self.schedule.variant)
        edges = [(u, w, self.scaling.t(lat)) for u, w, lat in dag.edges(data="latency")]
        edges += [(u, w, 0) for u, w in runtime_chains(self.problem)]
        for u, w, latency in edges:
            u, w = self.alias.get(u, u), self.alias.get(w, w)
            if u not in self.ops or w not in self.ops or u == w:
                continue  # an optional op this schedule does not have
            if self.part(w) == "fixed":
                continue  # so is u: the old schedule already orders them
            self._keep_before(u, w, latency)

    def shifts(self) -> None:
        """Rigid tails: the shift pairs the DAG and the orders bound, the cuts they follow."""
        for (gu, gw), slack in self.gap.items():
            self.model.add(self.shift[gu] - self.shift[gw] <= slack)
        first_rigid: dict[int, OpKey] = {}
        for key in self.window.tail:
            if key in self.window.elastic:
                continue
            d = self.device(key)
            if d not in first_rigid or self.start0[key] < self.start0[first_rigid[d]]:
                first_rigid[d] = key
        for d, key in first_rigid.items():
            self.model.add(self.start_of(key) >= self.cut[d])

    def memory(self) -> None:
        p, window = self.problem, self.window
        split = self.schedule.variant.split_backward
        busy = self.earliest
        per_device: dict[int, tuple[list[cp_model.IntervalVar], list[int]]] = defaultdict(
            lambda: ([], [])
        )
        for s in range(p.num_stages):
            device = p.device_of(s)
            if device not in busy:
                continue  # no free op: the device's prefix keeps its times, its tail its order
            for j in range(p.m):
                offload = self.ops.get(OpKey(OpKind.OFFLOAD, s, j))
                allocs, frees = activation_events(
                    p, s, split_backward=split,
                    offload_fraction=None if offload is None else offload.fraction,
                    recomputed=OpKey(OpKind.R, s, j) in self.ops,
                )  # fmt: skip
                for (ak, a_end), (fk, f_end), amount in match_lifetimes(allocs, frees):
                    alloc, free = OpKey(ak, s, j), OpKey(fk, s, j)
                    alloc, free = self.alias.get(alloc, alloc), self.alias.get(free, free)
                    if alloc not in self.ops:
                        continue  # a stage and microbatch the placement has not (dual)
                    if alloc in window.tail:
                        continue  # inside the tail: bounded by the old schedule's levels
                    demand = self.scaling.mem(amount)
                    if demand <= 0:
                        continue
                    begin = self.end_of(alloc) if a_end else self.start_of(alloc)
                    finish = self.end_of(free) if f_end else self.start_of(free)
                    if isinstance(begin, int) and isinstance(finish, int):
                        if finish <= busy[device]:
                            continue  # over before any free op of the device can start
                        interval = self.model.new_fixed_size_interval_var(
                            begin, finish - begin, f"m_{alloc}"
                        )
                    else:
                        length = self.model.new_int_var(0, 8 * self.top, f"l_{alloc}_{fk}")
                        interval = self.model.new_interval_var(begin, length, finish, f"m_{alloc}")
                    per_device[device][0].append(interval)
                    per_device[device][1].append(demand)
        for device, (intervals, demands) in per_device.items():
            room = self.scaling.cap(p.activation_room(device))
            self.model.add_cumulative(intervals, demands, room)

    def objective(self, objective: str, current: int) -> cp_model.IntVar:
        horizon = 8 * self.top
        obj = self.model.new_int_var(0, horizon, "objective")
        p, window = self.problem, self.window
        last: dict[int, list[Expr]] = defaultdict(list)
        first: dict[int, list[Expr]] = defaultdict(list)
        for key in (*window.free, *window.elastic):
            last[self.device(key)].append(self.end_of(key))
            first[self.device(key)].append(self.start_of(key))
        rigid = {k: op for k, op in window.tail.items() if k not in window.elastic}
        for part in (window.fixed, rigid):
            ends: dict[int, OpKey] = {}
            starts: dict[int, OpKey] = {}
            for key in part:
                d = self.device(key)
                end = self.start0[key] + self.size[key]
                if d not in ends or end > self.start0[ends[d]] + self.size[ends[d]]:
                    ends[d] = key
                if d not in starts or self.start0[key] < self.start0[starts[d]]:
                    starts[d] = key
            for d, key in ends.items():
                last[d].append(self.end_of(key))
            for d, key in starts.items():
                first[d].append(self.start_of(key))
        for d in range(p.p):
            if not last[d]:
                continue
            top = self.model.new_int_var(-self.top, horizon, f"last_{d}")
            for expr in last[d]:
                self.model.add(top >= expr)
            if objective == "makespan":
                self.model.add(obj >= top)
            else:
                low = self.model.new_int_var(-self.top, horizon, f"first_{d}")
                for expr in first[d]:
                    self.model.add(low <= expr)
                self.model.add(obj >= top - low)
        self.model.add(obj <= current)
        self.model.minimize(obj)
        return obj

    def hints(self, obj: cp_model.IntVar, current: int) -> None:
        for key, var in self.start.items():
            self.model.add_hint(var, self.start0[key])
        for var in self.shift.values():
            self.model.add_hint(var, 0)
        for device, var in self.cut.items():
            self.model.add_hint(var, self.scaling.t(self.window.cut[device]))
        self.model.add_hint(obj, current)

    def build(self, objective: str, current: int) -> cp_model.IntVar:
        """Every part, in this order: variables, free ops, tail order, DAG edges, shifts,
        memory, objective and hints (the old schedule)."""
        self.gap: dict[tuple[int, int], int] = {}
        self.variables()
        self.free_ops()
        self.tail_order()
        self.precedences()
        self.shifts()
        self.memory()
        obj = self.objective(objective, current)
        self.hints(obj, current)
        return obj


def solve_window(
    schedule: Schedule,
    window: Window,
    scaling: Scaling,
    *,
    waits: tuple[tuple[OpKey, OpKey], ...],
    time_limit: float,
    threads: int,
    seed: int,
    running: list[cp_model.CpSolver] | None = None,
) -> WindowResult | None:
    """Re-place the free ops of ``window`` and retime its tail; None if nothing was found.

    ``waits`` are the old schedule's cross-stream waits (:func:`pp_opt.simulator.order_of`).
    The solver is in ``running`` while it runs, so that a stop request can reach it.
    """
    b = _Builder(schedule, window, scaling, waits)
    objective = schedule.problem.objective
    current = scaling.t(schedule.objective_value(objective))
    obj = b.build(objective, current)
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.max_time_in_seconds = max(0.01, time_limit)
    params.num_workers = max(1, threads)
    params.random_seed = seed
    if handling_signals():  # the command line's handler stops the whole search (and says so)
        params.catch_sigint_signal = False
    if running is not None:
        running.append(solver)
    try:
        code = solver.solve(b.model)
    finally:
        if running is not None:
            running.remove(solver)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        log.debug("window [%g, %g): %s", window.start, window.end, solver.status_name(code))
        return None
    scale = scaling.time
    ops = list(window.fixed.values())
    for key, op in (*window.free.items(), *window.tail.items()):
        begin = solver.value(b.start_of(key)) / scale
        ops.append(replace(op, start=begin, end=begin + (op.end - op.start)))
    return WindowResult(
        ops=tuple(ops),
        objective=solver.value(obj) / scale,
        optimal=code == cp_model.OPTIMAL,
    )
