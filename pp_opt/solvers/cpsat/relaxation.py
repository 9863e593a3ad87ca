"""A lower bound from one device at a time: its own ops and memory, every other device free.

For a device ``d`` the *device relaxation* keeps ``d``'s compute ops, its one-at-a-time
compute stream and its memory cap (over the op sequence, as :mod:`.sequence`), and
replaces every other device by unlimited capacity: an op of ``d`` starts no earlier
than its longest DAG path from the sources (its *head*), two ops of ``d`` joined by a
DAG path are at least that path apart (the path's ops and latencies, run with no
waiting), and for ``makespan`` the schedule lasts at least each op's end plus its
longest path to the sinks (its *tail*); for ``span`` the device's window holds its ops.
Every valid schedule, restricted to ``d``, is a solution of this relaxation with the
same or a larger objective, so the relaxation's optimum (or CP-SAT's proved bound on
it) bounds the problem. Microbatches of one stage are interchangeable
(:func:`~.constraints.add_symmetry_breaking`), so some optimal schedule runs each op
kind of each stage in microbatch order: the relaxation orders them too, which keeps
the bound valid.

Costs and latencies are rounded *down* and memory demands down and the room up, so
the bound holds for the problem as given, whatever the scale. It applies to problems
without offload and recompute (copies and ``R`` ops change the memory in ways one
device's order does not decide). A split problem may also be run with the fused
backward (cheaper where ``t_bw < t_b + t_w``): then the bound is the smaller of both
variants'.

This is the bound that proves tight-memory instances: with memory binding, the
device at the turn of a ``v`` placement is the bottleneck and its relaxation is
usually exact.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass

import networkx as nx
from ortools.sat.python import cp_model

from pp_opt.dag import dag_for, longest_paths
from pp_opt.ops import OpKey, OpKind, Stream, duration, memory_delta, pair_relaxed
from pp_opt.order import Variant
from pp_opt.problem import Problem
from pp_opt.solvers.cpsat.sequence import add_order_steps
from pp_opt.solvers.cpsat.variables import Before
from pp_opt.solvers.cpsat.w_order import add_w_order, w_class
from pp_opt.solvers.lifetimes import match_lifetimes
from pp_opt.solvers.process.stop import Search, handling_signals

__all__ = ["RelaxationBound", "device_relaxation_bound"]

log = logging.getLogger(__name__)


RELAXATION_MAX_DEVICE_OPS = 100
"""Largest number of compute ops on one device for which the relaxation is solved (one
literal per pair of them). Above it (e.g. 144 on the 1.5B ``v`` rows of
``bench_solvers.py --parts tight``) it proved nothing better than
:func:`pp_opt.bounds.lower_bound` in a minute, and its time is the full model's."""


@dataclass(kw_only=True, slots=True, frozen=True)
class RelaxationBound:
    """The device relaxation's bound and how it was reached."""

    value: float
    """No valid schedule has a smaller objective (problem units)."""
    proved: bool
    """Whether every device's relaxation was solved to optimality (else a proved bound)."""
    seconds: float


def device_relaxation_bound(
    problem: Problem,
    objective: str,
    *,
    time_limit: float,
    upper: float | None = None,
    threads: int = 1,
    seed: int = 0,
    search: Search | None = None,
) -> RelaxationBound | None:
    """The largest device relaxation bound of ``problem`` (module docstring), or None
    where it does not apply (offload, recompute, too many ops per device) or found nothing.

    ``upper`` (a known schedule's objective) caps each relaxation's objective: a
    relaxation that cannot beat it bounds the problem by ``upper``. Each device gets an
    equal share of what is left of ``time_limit``; the device bounds stop once one
    reaches ``upper``, or when ``search`` (:mod:`pp_opt.solvers.process.stop`) is stopped.
    With ``problem.pairs`` it bounds the problem of ops at their least share of a pair
    (:func:`pp_opt.ops.pair_relaxed`): overlapped pairs may hide the communication.
    """
    if problem.offload or problem.recompute:
        return None
    if problem.pairs:
        problem = pair_relaxed(problem)
    started = time.perf_counter()
    variants = [Variant.of_problem(problem)]
    if problem.split_backward and any(
        st.fused_backward < st.t_b + st.t_w - 1e-12 for st in problem.stages
    ):
        variants.append(Variant(False, False, False))
    scale = _time_scale(problem)
    best: float | None = None
    proved = True
    for n, variant in enumerate(variants):
        dag = dag_for(problem, variant)
        per_device: dict[int, int] = defaultdict(int)
        for key in dag.nodes:
            per_device[dag.nodes[key]["device"]] += 1
        if max(per_device.values()) > RELAXATION_MAX_DEVICE_OPS:
            return None
        # Each variant gets an equal share of what is left.
        until = started + time_limit * (n + 1) / len(variants)
        value, optimal = _variant_value(problem, dag, objective, per_device, scale=scale,
                                        until=until, upper=upper, threads=threads, seed=seed,
                                        search=search)  # fmt: skip
        proved = proved and optimal
        best = value if best is None else min(best, value)
    seconds = time.perf_counter() - started
    if best is None or best <= 0:
        return None
    log.info("device relaxation bound %.6g in %.2f s (%s)", best, seconds,
             "proved" if proved else "partial")  # fmt: skip
    return RelaxationBound(value=best, proved=proved, seconds=seconds)


def _variant_value(
    problem: Problem,
    dag: nx.DiGraph,
    objective: str,
    per_device: dict[int, int],
    *,
    scale: float,
    until: float,
    upper: float | None,
    threads: int,
    seed: int,
    search: Search | None,
) -> tuple[float, bool]:
    """The largest device bound of one variant by ``until`` (``time.perf_counter()``), and
    whether every device was solved to optimality.

    The device with the most work comes first (it is usually the binding one), then the
    last devices (on ``v`` placements the turn of the V binds): the first gets half of
    the time, the others equal shares of the rest; the others usually finish at once,
    as they only need to reach the bound so far. Devices not solved to optimality get a
    second pass with the time left.
    """
    devices = sorted(range(problem.p), key=lambda d: (-per_device[d], -d))
    value = 0.0
    pending: list[int] = []
    for rounds in range(2):
        todo = devices if rounds == 0 else pending
        pending = []
        for i, device in enumerate(todo):
            left = until - time.perf_counter()
            if left <= 0.01 or (search is not None and search.stopped):
                return value, False
            if upper is not None and value >= upper - 1e-9:
                return value, True
            share = left / 2 if rounds == 0 and i == 0 and len(todo) > 1 else left / (len(todo) - i)
            got, optimal = _solve_device(problem, dag, (device,), objective, scale=scale,
                                         time_limit=share, upper=upper, lower=value,
                                         threads=threads, seed=seed, search=search)  # fmt: skip
            value = max(value, got)
            if not optimal:
                pending.append(device)
        if not pending:
            return value, True
    return value, False


def _time_scale(problem: Problem) -> float:
    from pp_opt.solvers.cpsat.scaling import choose_scaling

    return choose_scaling(problem).time


def _down(value: float, scale: float) -> int:
    return int(math.floor(value * scale + 1e-9))


def _solve_device(
    problem: Problem,
    dag: nx.DiGraph,
    devices: tuple[int, ...],
    objective: str,
    *,
    scale: float,
    time_limit: float,
    upper: float | None,
    lower: float,
    threads: int,
    seed: int,
    search: Search | None = None,
) -> tuple[float, bool]:
    """``(bound, optimal)`` of the relaxation that keeps ``devices`` (one, or a few
    together), in problem units. The objective is at least ``lower`` (the bound so far:
    only more than that matters), so a relaxation that cannot raise the bound is done at
    its first solution there."""
    dur = {k: _down(duration(problem, k.kind, k.stage), scale) for k in dag.nodes}
    lat = {(u, w): _down(x, scale) for u, w, x in dag.edges(data="latency")}
    order = list(nx.topological_sort(dag))
    head, tail = longest_paths(dag, dur, lat)
    own = dag.nodes
    mine = [k for k in order if own[k]["device"] in devices and own[k]["stream"] is Stream.COMPUTE]
    lags = _device_lags(dag, order, mine, dur, lat)

    horizon = sum(dur.values()) + sum(lat.values()) + 1
    top = horizon if upper is None else min(horizon, int(math.ceil(upper * scale + 1e-9)))
    model = cp_model.CpModel()
    start = {k: model.new_int_var(head[k] if objective == "makespan" else 0, horizon, "s")
             for k in mine}  # fmt: skip
    for device in devices:
        model.add_no_overlap([model.new_fixed_size_interval_var(start[k], dur[k], "i")
                              for k in mine if own[k]["device"] == device])  # fmt: skip
    for (a, b), lag in lags.items():
        model.add(start[b] >= start[a] + lag)
    before = _add_pair_orders(model, dag, mine, lags, start, dur)
    for device in devices:
        keys = [k for k in mine if own[k]["device"] == device]
        # Alike W run in their backwards' order (w_order): some optimum does, so its
        # restriction to the device is a solution here.
        add_w_order(model, keys, before, w_class(problem))
        add_order_steps(model, [k for k in keys if dur[k] > 0], before)
        _add_memory(model, problem, device, keys, before)
    floor = min(top, int(math.floor(lower * scale + 1e-9)))
    obj = model.new_int_var(floor, top, "objective")
    if objective == "makespan":
        for k in mine:
            model.add(obj >= start[k] + dur[k] + tail[k])
    else:
        firsts = {d: model.new_int_var(0, horizon, f"first_{d}") for d in devices}
        for k in mine:
            first = firsts[own[k]["device"]]
            model.add(first <= start[k])
            model.add(obj >= start[k] + dur[k] - first)
    model.minimize(obj)
    return _solved_bound(model, scale=scale, top=top, upper=upper, time_limit=time_limit,
                         threads=threads, seed=seed, search=search)  # fmt: skip


def _device_lags(
    dag: nx.DiGraph,
    order: list[OpKey],
    mine: list[OpKey],
    dur: dict[OpKey, int],
    lat: dict[tuple[OpKey, OpKey], int],
) -> dict[tuple[OpKey, OpKey], int]:
    """Least start-to-start gap between the ops of the device: their DAG paths
    (:func:`_lags`), and each op of a stage and kind runs after the previous microbatch's
    (module docstring)."""
    lags = _lags(dag, order, mine, dur, lat)
    for k in mine:
        nxt = OpKey(k.kind, k.stage, k.microbatch + 1)
        if nxt in dag:
            lags[(k, nxt)] = max(lags.get((k, nxt), 0), dur[k])
    return lags


def _add_pair_orders(
    model: cp_model.CpModel,
    dag: nx.DiGraph,
    mine: list[OpKey],
    lags: dict[tuple[OpKey, OpKey], int],
    start: dict[OpKey, cp_model.IntVar],
    dur: dict[OpKey, int],
) -> Before:
    """Which op of each pair on one device runs first: fixed where ``lags`` chain them,
    else a literal that keeps the two apart."""
    own = dag.nodes
    graph = nx.DiGraph(list(lags))
    graph.add_nodes_from(mine)
    after = {k: nx.descendants(graph, k) for k in mine}
    before: Before = {}
    for i, a in enumerate(mine):
        for b in mine[i + 1 :]:
            if own[a]["device"] != own[b]["device"]:
                continue
            if b in after[a] or a in after[b]:
                before[(a, b)] = b in after[a]
                before[(b, a)] = not before[(a, b)]
                continue
            lit = model.new_bool_var("before")
            model.add(start[a] + dur[a] <= start[b]).only_enforce_if(lit)
            model.add(start[b] + dur[b] <= start[a]).only_enforce_if(~lit)
            before[(a, b)], before[(b, a)] = lit, ~lit
    return before


def _solved_bound(
    model: cp_model.CpModel,
    *,
    scale: float,
    top: int,
    upper: float | None,
    time_limit: float,
    threads: int,
    seed: int,
    search: Search | None,
) -> tuple[float, bool]:
    """``(bound, optimal)`` of a device relaxation ``model`` whose objective is at most
    ``top`` (``upper`` scaled), in problem units."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, time_limit)
    solver.parameters.num_workers = max(1, threads)
    solver.parameters.random_seed = seed
    if handling_signals():  # the command line's handler stops the search (and says so)
        solver.parameters.catch_sigint_signal = False
    if search is not None:
        search.on_stop(solver.stop_search)
    code = solver.solve(model)
    if code == cp_model.INFEASIBLE:  # nothing beats ``upper`` (a known schedule's value)
        return (top / scale, True) if upper is not None else (0.0, False)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN):
        return 0.0, False
    # Without a solution (UNKNOWN) the proved bound still holds.
    bound = solver.best_objective_bound
    if not math.isfinite(bound):
        return 0.0, False
    return max(0.0, bound) / scale, code == cp_model.OPTIMAL


def _lags(
    dag: nx.DiGraph,
    order: list[OpKey],
    mine: list[OpKey],
    dur: dict[OpKey, int],
    lat: dict[tuple[OpKey, OpKey], int],
) -> dict[tuple[OpKey, OpKey], int]:
    """Longest DAG path from the start of each op of the device to the start of each
    later one."""
    position = {k: i for i, k in enumerate(order)}
    own = set(mine)
    lags: dict[tuple[OpKey, OpKey], int] = {}
    for a in mine:
        dist = {a: 0}
        for k in order[position[a] :]:
            if k not in dist:
                continue
            for w in dag.successors(k):
                reach = dist[k] + dur[k] + lat[(k, w)]
                if dist.get(w, -1) < reach:
                    dist[w] = reach
        for b, gap in dist.items():
            if b in own and b != a:
                lags[(a, b)] = gap
    return lags


def _add_memory(
    model: cp_model.CpModel,
    problem: Problem,
    device: int,
    mine: list[OpKey],
    before: Before,
) -> None:
    """The device's memory at each forward's start under its room (:mod:`.sequence`),
    demands rounded down and the room up on a fine scale."""
    from pp_opt.solvers.cpsat.scaling import choose_scaling

    scaling = choose_scaling(problem)
    room = int(math.ceil(problem.activation_room(device) * scaling.memory - 1e-9))
    level: dict[OpKey, int] = defaultdict(int)
    keys = set(mine)
    for k in mine:
        if k.kind is not OpKind.F:
            continue
        kinds = [OpKind.BW] if OpKey(OpKind.BW, k.stage, k.microbatch) in keys else [
            OpKind.B, OpKind.W]  # fmt: skip
        frees = [(OpKey(kind, k.stage, k.microbatch), -memory_delta(problem, kind, k.stage)[1])
                 for kind in kinds]  # fmt: skip
        for alloc, free, amount in match_lifetimes([(k, memory_delta(problem, k.kind, k.stage)[0])],
                                                   frees):  # fmt: skip
            demand = int(math.floor(amount * scaling.memory + 1e-9))
            level[alloc] += demand
            level[free] -= demand
    for x in mine:
        if x.kind is not OpKind.F:
            continue
        constant = level[x]
        terms: list[cp_model.LinearExprT] = []
        for y in mine:
            if y == x or level[y] == 0:
                continue
            lit = before[(y, x)]
            if isinstance(lit, bool):
                constant += level[y] if lit else 0
            else:
                terms.append(level[y] * lit)
        if terms:
            model.add(constant + sum(terms) <= room)
        elif constant > room:
            model.add_bool_or([])
