"""The CP-SAT model of one neighbourhood (:mod:`.window`): free ops placed, tails shifted.

Variables: a start per free op, a shift per shift group (the tails of its devices move
by it), the objective. Why a solution is a valid schedule of the whole problem:

- fixed ops keep their times, and free ops start after the fixed ops of their stream
  (or host link) end and after every DAG predecessor;
- every fixed and free op of a device ends by the device's shifted cut, and each tail
  moves rigidly, so no free op overlaps a tail op and the tail's own order, timing and
  memory events are those of the old schedule shifted (see :mod:`.window`);
- every DAG edge that touches a free or a tail op is a constraint (edges between two
  tails of different groups bound the difference of their shifts);
- the memory of each device is a cumulative of the lifetimes that start before its
  cut, so the level is under the cap wherever it can differ from the old schedule's.

Times are integers in the units of :func:`pp_opt.solvers.cpsat.scaling.choose_scaling`;
the caller re-times the result with exact durations and validates it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

from ortools.sat.python import cp_model

from pp_opt.dag import dag_for
from pp_opt.ops import OpKey, OpKind, Stream, duration
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, ScheduledOp
from pp_opt.solvers.cpsat.scaling import Scaling
from pp_opt.solvers.lifetimes import activation_events, match_lifetimes
from pp_opt.solvers.lns.window import Window

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


def queue_of(problem: Problem, device: int, stream: Stream) -> QueueKey:
    """The resource an op uses: its device's stream, or its host link for shared copies."""
    link = None if stream is Stream.COMPUTE else problem.link_group(device)
    return ("device", device, stream) if link is None else ("link", link, stream)


class _Builder:
    """Builds the sub-model; one instance per neighbourhood."""

    def __init__(self, schedule: Schedule, window: Window, scaling: Scaling) -> None:
        self.schedule = schedule
        self.problem = schedule.problem
        self.window = window
        self.scaling = scaling
        self.model = cp_model.CpModel()
        self.ops = {op.key: op for op in schedule.ops}
        self.size = {
            key: scaling.t(duration(self.problem, key.kind, key.stage, op.fraction))
            for key, op in self.ops.items()
        }
        self.start0 = {key: scaling.t(op.start) for key, op in self.ops.items()}
        self.top = max(self.start0[k] + self.size[k] for k in self.ops) + 1
        self.start: dict[OpKey, cp_model.IntVar] = {}
        self.shift: dict[int, cp_model.IntVar] = {}
        self.earliest: dict[int, int] = {}
        """Per device with free ops, no free op of it can start earlier than this."""

    def device(self, key: OpKey) -> int:
        return self.problem.device_of(key.stage)

    def start_of(self, key: OpKey) -> Expr:
        if key in self.window.free:
            return self.start[key]
        if key in self.window.tail:
            return self.start0[key] + self.shift[self.window.group[self.device(key)]]
        return self.start0[key]

    def end_of(self, key: OpKey) -> Expr:
        return self.start_of(key) + self.size[key]

    def variables(self) -> None:
        for key in self.window.free:
            self.start[key] = self.model.new_int_var(0, self.top, f"s_{key}")
        for device in self.window.cut:
            group = self.window.group[device]
            if group not in self.shift:
                self.shift[group] = self.model.new_int_var(-self.top, self.top, f"d_{group}")

    def stream_rules(self) -> None:
        """Free ops after the fixed ops of their queue, one at a time, before the cut."""
        p = self.problem
        fixed_end: dict[QueueKey, int] = defaultdict(int)
        for key, op in self.window.fixed.items():
            q = queue_of(p, self.device(key), op.stream)
            fixed_end[q] = max(fixed_end[q], self.start0[key] + self.size[key])
        intervals: dict[QueueKey, list[cp_model.IntervalVar]] = defaultdict(list)
        for key, op in self.window.free.items():
            q = queue_of(p, self.device(key), op.stream)
            self.model.add(self.start[key] >= fixed_end[q])
            device = self.device(key)
            self.earliest[device] = min(self.earliest.get(device, fixed_end[q]), fixed_end[q])
            intervals[q].append(
                self.model.new_fixed_size_interval_var(self.start[key], self.size[key], f"i_{key}")
            )
            for device in self._sharing(key, op.stream):
                cut = self.window.cut.get(device)
                if cut is not None:
                    shift = self.shift[self.window.group[device]]
                    self.model.add(self.end_of(key) <= self.scaling.t(cut) + shift)
        for queue in intervals.values():
            if len(queue) > 1:
                self.model.add_no_overlap(queue)
        # Fixed ops end by the cut too (they do in the old schedule; the shift keeps it).
        latest: dict[int, int] = defaultdict(int)
        for key in self.window.fixed:
            device = self.device(key)
            latest[device] = max(latest[device], self.start0[key] + self.size[key])
        for device, cut in self.window.cut.items():
            shift = self.shift[self.window.group[device]]
            self.model.add(self.scaling.t(cut) + shift >= latest[device])

    def _sharing(self, key: OpKey, stream: Stream) -> list[int]:
        """Devices whose tails an op must end before: its own, and its link's for copies."""
        device = self.device(key)
        link = None if stream is Stream.COMPUTE else self.problem.link_group(device)
        return [device] if link is None else list(self.problem.host_links[link])

    def precedences(self) -> None:
        dag = dag_for(self.problem, self.schedule.variant)
        gap: dict[tuple[int, int], int] = {}
        for u, w, lat in dag.edges(data="latency"):
            if u not in self.ops or w not in self.ops:
                continue  # an optional op this schedule does not have
            pu, pw = self.window.part_of(u), self.window.part_of(w)
            if pw == "fixed":
                continue  # so is u: the old schedule already orders them
            latency = self.scaling.t(lat)
            if pu == "tail" and pw == "tail":
                gu, gw = self.window.group[self.device(u)], self.window.group[self.device(w)]
                if gu != gw:
                    slack = self.start0[w] - self.start0[u] - self.size[u] - latency
                    gap[(gu, gw)] = min(gap.get((gu, gw), slack), slack)
                continue
            self.model.add(self.end_of(u) + latency <= self.start_of(w))
        for (gu, gw), slack in gap.items():
            self.model.add(self.shift[gu] - self.shift[gw] <= slack)

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
                continue  # no free op: nothing on the device moves but its tail, rigidly
            for j in range(p.m):
                offload = self.ops.get(OpKey(OpKind.OFFLOAD, s, j))
                allocs, frees = activation_events(
                    p, s, split_backward=split,
                    offload_fraction=None if offload is None else offload.fraction,
                    recomputed=OpKey(OpKind.R, s, j) in self.ops,
                )  # fmt: skip
                for (ak, a_end), (fk, f_end), amount in match_lifetimes(allocs, frees):
                    alloc, free = OpKey(ak, s, j), OpKey(fk, s, j)
                    if alloc in window.tail:
                        continue  # inside the tail: repeats the old schedule's
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
                        length = self.model.new_int_var(0, 2 * self.top, f"l_{alloc}_{fk}")
                        interval = self.model.new_interval_var(begin, length, finish, f"m_{alloc}")
                    per_device[device][0].append(interval)
                    per_device[device][1].append(demand)
        for device, (intervals, demands) in per_device.items():
            dev = p.devices[device]
            self.model.add_cumulative(intervals, demands, self.scaling.cap(dev.cap - dev.static))

    def objective(self, objective: str, current: int) -> cp_model.IntVar:
        obj = self.model.new_int_var(0, 4 * self.top, "objective")
        p, window = self.problem, self.window
        last: dict[int, list[Expr]] = defaultdict(list)
        first: dict[int, list[Expr]] = defaultdict(list)
        for key in window.free:
            last[self.device(key)].append(self.end_of(key))
            first[self.device(key)].append(self.start_of(key))
        for part in (window.fixed, window.tail):
            ends: dict[int, OpKey] = {}
            starts: dict[int, OpKey] = {}
            for key in part:
                d = self.device(key)
                if d not in ends or self.start0[key] + self.size[key] > (
                    self.start0[ends[d]] + self.size[ends[d]]
                ):
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
            top = self.model.new_int_var(-self.top, 4 * self.top, f"last_{d}")
            for expr in last[d]:
                self.model.add(top >= expr)
            if objective == "makespan":
                self.model.add(obj >= top)
            else:
                low = self.model.new_int_var(-self.top, 4 * self.top, f"first_{d}")
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
        self.model.add_hint(obj, current)


def solve_window(
    schedule: Schedule,
    window: Window,
    scaling: Scaling,
    *,
    time_limit: float,
    threads: int,
    seed: int,
) -> WindowResult | None:
    """Re-place the free ops of ``window`` and shift the tails; None if nothing was found."""
    b = _Builder(schedule, window, scaling)
    objective = schedule.problem.objective
    current = scaling.t(schedule.objective_value(objective))
    b.variables()
    b.stream_rules()
    b.precedences()
    b.memory()
    obj = b.objective(objective, current)
    b.hints(obj, current)
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.max_time_in_seconds = max(0.01, time_limit)
    params.num_workers = max(1, threads)
    params.random_seed = seed
    code = solver.solve(b.model)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        log.debug("window [%g, %g): %s", window.start, window.end, solver.status_name(code))
        return None
    scale = scaling.time
    ops = list(window.fixed.values())
    for key, op in window.free.items():
        begin = solver.value(b.start[key]) / scale
        ops.append(ScheduledOp(op.kind, op.stage, op.microbatch, op.stream, begin,
                               begin + (op.end - op.start), op.fraction))  # fmt: skip
    for key, op in window.tail.items():
        moved = solver.value(b.shift[window.group[b.device(key)]]) / scale
        ops.append(ScheduledOp(op.kind, op.stage, op.microbatch, op.stream, op.start + moved,
                               op.end + moved, op.fraction))  # fmt: skip
    return WindowResult(
        ops=tuple(ops),
        objective=solver.value(obj) / scale,
        optimal=code == cp_model.OPTIMAL,
    )
