"""A makespan bound from one device at a time, as a fluid: a linear program over time buckets.

For a device ``d`` and a horizon ``T`` cut into ``N`` buckets of ``delta = T / N``, the
*fluid relaxation* counts, per op type ``o`` of ``d`` (kind and stage; microbatches are
interchangeable), ``c_o(k)``: how many ops of ``o`` start before ``(k+1) delta``, and
``P_o(k)``: how much of their time has run by then. Every schedule of makespan at most ``T``
gives these numbers, and they satisfy, with every other device free (as in the CP-SAT
device relaxation, :mod:`pp_opt.solvers.cpsat.relaxation`):

- counts and run time only grow, all ``m`` ops run in full by ``T``, and run time never
  exceeds what has started: ``P_o(k) <= t_o c_o(k)``;
- one op at a time: the run time of all of ``d``'s types grows by at most ``delta`` per
  bucket, and what has started but not run is at most the longest op (only one is running
  at any moment): ``sum t_o c_o(k) - P_o(k) <= max t_o``;
- heads and tails: no op of ``o`` starts before its longest path from the sources
  (``head``), so ``P_o(k) <= (k+1) delta - head``; each ends by ``T`` minus its longest path
  to the sinks (``tail``), so every op of ``o`` has run in full once ``(k+1) delta >= T -
  tail``;
- lags: where the DAG joins ``u`` to ``v`` on ``d`` (the same microbatch), ``v`` starts at
  least the longest path ``l`` after ``u`` starts (``l - t_u`` after it ends). So ``c_v(k)
  <= c_u(k - floor(l / delta))`` and ``c_v(k) <= P_u(k - g) / t_u`` with ``g = floor((l -
  t_u) / delta)`` (an op that has ended has run in full);
- memory: at each bucket boundary ``k delta``, what the forwards that started before it
  allocated, less what the ``B``/``W`` that ended before it freed (at most ``P / t`` of each
  type), fits the room.

So where this linear program is infeasible (HiGHS says so), no schedule has a makespan of
``T`` or less: the largest such ``T`` found by bisection bounds the makespan, whatever
``N`` (a coarser ``N`` only weakens it). It reads the warm-up (nothing is freed before the
first backward), the memory-limited steady state (each activation lives at least its round
trip) and the cool-down (only what is held can run while the last microbatch goes round)
together, which the closed forms of :mod:`pp_opt.bounds` bound one at a time. It applies to
makespan problems without offload and recompute. A split problem whose fused backward is
cheaper somewhere is bounded for both variants (the smaller holds), as
:func:`pp_opt.bounds.lower_bound` does.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import networkx as nx

from pp_opt.bounds import device_bounds
from pp_opt.dag import dag_for
from pp_opt.ops import OpKey
from pp_opt.order import Variant
from pp_opt.problem import Problem

if TYPE_CHECKING:
    import numpy as np

__all__ = ["FluidBound", "fluid_bound", "applies"]

log = logging.getLogger(__name__)

FLUID_BUCKETS = 250
"""Buckets of the horizon (``N``). On the tight ``v`` rows of ``bench_solvers.py --parts
tight`` 250 gives 1367.2 (1.5B V-Min) and 3501.6 (28.3B V-Min) against 1368.1 and 3518.0
with 600 and 400, at a quarter to a half of the time per linear program (0.4-0.6 s)."""
FLUID_COARSE_BUCKETS = 100
"""Buckets of the first bisection, which locates the bound of the first device cheaply."""
FLUID_TOLERANCE = 1e-3
"""The bisection stops when the bound is known to this fraction of the upper end."""
FLUID_MIN_DEVICE_OPS = 100
"""The fluid bound runs where some device has more compute ops than this: below it the
CP-SAT device relaxation (:data:`~pp_opt.solvers.cpsat.relaxation.RELAXATION_MAX_DEVICE_OPS`)
solves the same device exactly."""
FLUID_MAX_TYPES = 24
"""Most op types (kind and stage) on one device for which the program is built (the lag
rows grow with their square)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class FluidBound:
    """The fluid relaxation's bound and where it came from."""

    value: float
    """No valid schedule has a smaller makespan."""
    device: int
    """The device whose relaxation gave it."""
    programs: int
    """Linear programs solved (all devices and variants)."""
    seconds: float


@dataclass(slots=True, frozen=True)
class _Device:
    """One device's op types (microbatch 0 stands for all) and what the program needs."""

    device: int
    types: tuple[OpKey, ...]
    time: tuple[float, ...]
    head: tuple[float, ...]
    tail: tuple[float, ...]
    memory: tuple[float, ...]
    """Net memory of one op: ``m_b`` for a forward, minus what a ``B``/``W``/``BW`` frees."""
    lags: tuple[tuple[int, int, float], ...]
    """``(u, v, l)``: ``v`` starts at least ``l`` after ``u`` starts."""
    room: float


def applies(problem: Problem, objective: str) -> bool:
    """Whether :func:`fluid_bound` runs for ``problem``: makespan, no offload or recompute,
    a device with more than :data:`FLUID_MIN_DEVICE_OPS` ops, few op types per device."""
    if objective != "makespan" or problem.offload or problem.recompute:
        return False
    kinds = 3 if problem.split_backward else 2
    per_device = max(len(problem.stages_on(d)) for d in range(problem.p))
    return per_device * kinds <= FLUID_MAX_TYPES and problem.m * per_device * kinds > (
        FLUID_MIN_DEVICE_OPS
    )


def fluid_bound(
    problem: Problem,
    *,
    lower: float,
    upper: float,
    deadline: float,
    buckets: int = FLUID_BUCKETS,
) -> FluidBound | None:
    """The largest fluid bound above ``lower`` found by ``deadline`` (``time.perf_counter()``),
    or None when none is. ``upper`` is a known schedule's makespan: no bound goes above it.

    Devices go in the order of their closed-form bounds (:func:`pp_opt.bounds.device_bounds`,
    largest first; on ``v`` placements the device at the turn binds). The first is bisected
    with :data:`FLUID_COARSE_BUCKETS` (a program a fifth of the time), then with ``buckets``
    upward from there; each other one gets one program just above the best bound so far,
    and a bisection only if that program is infeasible. Every value found is a bound.
    """
    try:
        return _fluid_bound(problem, lower=lower, upper=upper, deadline=deadline,
                            buckets=buckets)  # fmt: skip
    finally:
        if "highspy" in sys.modules:
            # HiGHS sizes one thread pool per process on first use (ours: one thread); a
            # later HiGHS solve there (the MILP backend, another thread count) would fail.
            sys.modules["highspy"].Highs.resetGlobalScheduler(True)


def _fluid_bound(
    problem: Problem, *, lower: float, upper: float, deadline: float, buckets: int
) -> FluidBound | None:
    started = time.perf_counter()
    variants = [Variant(problem.split_backward, False, False)]
    if problem.split_backward and any(
        st.fused_backward < st.t_b + st.t_w - 1e-12 for st in problem.stages
    ):
        variants.append(Variant(False, False, False))
    closed = device_bounds(problem)
    order = sorted(range(problem.p), key=lambda d: -closed[d])
    programs = 0
    result: tuple[float, int] | None = None
    for n, variant in enumerate(variants):
        until = started + (deadline - started) * (n + 1) / len(variants)
        best, where = lower, -1
        for i, device in enumerate(order):
            if time.perf_counter() >= until or best >= upper * (1 - FLUID_TOLERANCE):
                break
            model = _device_model(problem, variant, device)
            if model is None:
                continue
            low = best
            if i == 0:  # locate it cheaply first: a coarse program bounds too
                low, solved = _search(model, problem.m, best, upper, FLUID_COARSE_BUCKETS,
                                      until, gallop=False)  # fmt: skip
                programs += solved
            value, solved = _search(model, problem.m, low, upper, buckets, until,
                                    gallop=i == 0)  # fmt: skip
            programs += solved
            if value > best:
                best, where = value, device
        if where < 0:
            return None  # this variant gave nothing above ``lower``: neither does the min
        result = (best, where) if result is None or best < result[0] else result
    if result is None:
        return None
    seconds = time.perf_counter() - started
    log.info("fluid bound %.6g (device %d, %d programs, %.2f s)", result[0], result[1],
             programs, seconds)  # fmt: skip
    return FluidBound(value=result[0], device=result[1], programs=programs, seconds=seconds)


def _search(
    model: _Device, m: int, low: float, high: float, buckets: int, until: float, *, gallop: bool
) -> tuple[float, int]:
    """``(bound, programs solved)``: the largest horizon in ``[low, high]`` shown infeasible
    (``low`` when none is), to :data:`FLUID_TOLERANCE`. The first program tries just above
    ``low``, so a device that cannot raise the bound costs one; with ``gallop`` the steps
    above ``low`` then double until one is feasible (a refinement expects a small rise),
    else it bisects at once."""
    programs = 0
    step = jump = FLUID_TOLERANCE * high
    probe = min(high, low + step)
    climbing = gallop
    while high - low > step and time.perf_counter() < until:
        programs += 1
        if _infeasible(model, m, probe, buckets, until):
            low = probe
            if climbing:
                jump *= 2
                probe = min(high, low + jump)
                continue
        else:
            high = probe
            climbing = False
        probe = (low + high) / 2
    return low, programs


def _device_model(problem: Problem, variant: Variant, device: int) -> _Device | None:
    dag = dag_for(problem, variant)
    keys = [k for k in dag if k.microbatch == 0]
    one = dag.subgraph(keys)
    time_of = {k: float(dag.nodes[k]["duration"]) for k in keys}
    order = list(nx.topological_sort(one))
    head: dict[OpKey, float] = {}
    for k in order:
        head[k] = max((head[u] + time_of[u] + one.edges[u, k]["latency"]
                       for u in one.predecessors(k)), default=0.0)  # fmt: skip
    tail: dict[OpKey, float] = {}
    for k in reversed(order):
        tail[k] = max((one.edges[k, w]["latency"] + time_of[w] + tail[w]
                       for w in one.successors(k)), default=0.0)  # fmt: skip
    types = tuple(k for k in order if problem.device_of(k.stage) == device)
    if not types or len(types) > FLUID_MAX_TYPES:
        return None
    index = {k: i for i, k in enumerate(types)}
    lags = []
    for u in types:
        # Longest path from u's start to every op after it (microbatch 0's DAG is small).
        reach = {u: 0.0}
        for k in order[order.index(u) :]:
            if k not in reach:
                continue
            for w in one.successors(k):
                reach[w] = max(reach.get(w, -math.inf),
                               reach[k] + time_of[k] + one.edges[k, w]["latency"])  # fmt: skip
        lags += [(index[u], index[v], reach[v]) for v in types if v != u and v in reach]
    memory = tuple(float(dag.nodes[k]["mem_start"] + dag.nodes[k]["mem_end"]) for k in types)
    return _Device(
        device=device,
        types=types,
        time=tuple(time_of[k] for k in types),
        head=tuple(head[k] for k in types),
        tail=tuple(tail[k] for k in types),
        memory=memory,
        lags=tuple(lags),
        room=problem.devices[device].cap - problem.devices[device].static,
    )


def _infeasible(model: _Device, m: int, horizon: float, buckets: int, until: float) -> bool:
    """Whether HiGHS proves the program of ``model`` at ``horizon`` infeasible (anything
    else, a time-out included, counts as feasible: the bound only rises on a proof)."""
    import highspy  # native, loaded only where the bound runs (the solve's child process)

    program = _program(model, m, horizon, buckets)
    if program is None:
        return True  # the bounds on the variables contradict each other
    lower, upper, rows = program
    highs = _quiet_highs(highspy)
    highs.setOptionValue("threads", 1)
    highs.setOptionValue("solver", "ipm")
    highs.setOptionValue("run_crossover", "off")  # only feasibility matters: no vertex needed
    highs.setOptionValue("time_limit", max(0.01, until - time.perf_counter()))
    highs.addVars(len(lower), lower, upper)
    row_lower, row_upper, starts, index, value = rows
    highs.addRows(len(row_lower), row_lower, row_upper, len(index), starts, index, value)
    highs.run()
    return bool(highs.getModelStatus() == highspy.HighsModelStatus.kInfeasible)


def _quiet_highs(highspy: Any) -> Any:
    """A silent ``highspy.Highs``: HiGHS 1.16 prints its banner to file descriptor 1 when
    it is made, before any option can be set, and stdout may be someone's data (``pp-opt
    ... > out``); so it is made with descriptor 1 on the null device."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            highs = highspy.Highs()
        highs.setOptionValue("output_flag", False)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    return highs


Rows = tuple["np.ndarray", "np.ndarray", "np.ndarray", "np.ndarray", "np.ndarray"]


def _program(
    model: _Device, m: int, horizon: float, buckets: int
) -> tuple[np.ndarray, np.ndarray, Rows] | None:
    """Variable bounds and rows of the fluid program (module docstring), or None when the
    variable bounds alone are contradictory. Variables: ``c_o(k)`` at ``o N + k``, ``P_o(k)``
    at ``(n + o) N + k`` for ``n`` types."""
    import highspy
    import numpy as np

    n, size = len(model.types), buckets
    delta = horizon / size
    eps = 1e-9 * max(1.0, horizon)
    inf = highspy.kHighsInf
    lower = np.zeros(2 * n * size)
    upper = np.empty(2 * n * size)

    def c(o: int, k: int) -> int:
        return o * size + k

    def p(o: int, k: int) -> int:
        return (n + o) * size + k

    ends = (np.arange(size) + 1) * delta
    for o in range(n):
        t = model.time[o]
        upper[c(o, 0) : c(o, 0) + size] = m
        upper[p(o, 0) : p(o, 0) + size] = np.minimum(m * t, np.maximum(0.0, ends - model.head[o]))
        started = ends > model.head[o] + eps
        upper[c(o, 0) : c(o, 0) + size][~started] = 0.0
        done = ends >= horizon - model.tail[o] + eps
        done[-1] = True
        lower[c(o, 0) : c(o, 0) + size][done] = m
        lower[p(o, 0) : p(o, 0) + size][done] = m * t
    rows: list[tuple[list[int], list[float], float, float]] = []
    for o in range(n):
        t = model.time[o]
        for k in range(size):
            if k:
                rows.append(([c(o, k), c(o, k - 1)], [1.0, -1.0], 0.0, inf))
                rows.append(([p(o, k), p(o, k - 1)], [1.0, -1.0], 0.0, inf))
            rows.append(([p(o, k), c(o, k)], [1.0, -t], -inf, 0.0))
    for u, v, lag in model.lags:
        t = model.time[u]
        # Rounded down (and a hair more, so float noise never rounds up).
        start_gap = max(0, math.floor(lag / delta - 1e-9))
        end_gap = max(0, math.floor((lag - t) / delta - 1e-9)) if t > 0 else None
        for k in range(size):
            if k < start_gap or (end_gap is not None and k < end_gap):
                upper[c(v, k)] = 0.0
                continue
            rows.append(([c(v, k), c(u, k - start_gap)], [1.0, -1.0], -inf, 0.0))
            if end_gap is not None:
                rows.append(([c(v, k), p(u, k - end_gap)], [1.0, -1.0 / t], -inf, 0.0))
    longest = max(model.time)
    for k in range(size):
        run = [p(o, k) for o in range(n)] + ([p(o, k - 1) for o in range(n)] if k else [])
        rows.append((run, [1.0] * n + ([-1.0] * n if k else []), -inf, delta * (1 + 1e-9)))
        rows.append(([c(o, k) for o in range(n)] + [p(o, k) for o in range(n)],
                     list(model.time) + [-1.0] * n, -inf, longest * (1 + 1e-9)))  # fmt: skip
        index, value = [], []
        for o in range(n):
            net, t = model.memory[o], model.time[o]
            if net > 0:  # allocated by the forwards started before k delta... (row k + 1)
                index.append(c(o, k))
                value.append(net)
            elif net < 0:  # ...less what the ops that ended by then freed
                index.append(p(o, k) if t > 0 else c(o, k))
                value.append(net / t if t > 0 else net)
        if index:
            rows.append((index, value, -inf, model.room * (1 + 1e-9) + 1e-12))
    if np.any(lower > upper + 1e-9):
        return None
    starts = np.cumsum([0] + [len(r[0]) for r in rows[:-1]]).astype(np.int32)
    flat_index = np.fromiter((i for r in rows for i in r[0]), dtype=np.int32)
    flat_value = np.fromiter((x for r in rows for x in r[1]), dtype=np.float64)
    bounds = (np.array([r[2] for r in rows]), np.array([r[3] for r in rows]))
    return lower, upper, (bounds[0], bounds[1], starts, flat_index, flat_value)
