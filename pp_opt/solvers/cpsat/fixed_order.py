"""Copies for a given compute order: the full model with every device's compute order fixed.

Where only offload meets a cap, a good schedule is usually a compute order made for a
larger cap (a rule schedule at a raised room, :func:`pp_opt.orders.offload.offload_warm.raised`)
with copies in its gaps. The greedy placement of :mod:`pp_opt.orders.offload.offload_links`
chooses those copies one event at a time and loses much of the order's speed on shared
host links (the ``v`` offload instance of ``bench_solvers.py --parts exact``: V-Half's
order at 1.5 times the room runs in 36.16 without copies, and in 41.57 with the greedy
copies at the real cap). Fixing each device's compute order in the CP-SAT model leaves
it only the copies' choice and timing (and when each compute op starts), a much smaller
search that found 37.97 for the same order in 15 s.

The model is the full one (:func:`~.model.build_model`), so every constraint of the
problem holds; the fixed order only removes schedules, and the result is validated like
any other backend result.
"""

from __future__ import annotations

from dataclasses import replace

import networkx as nx

from pp_opt.errors import PPOptError
from pp_opt.metrics import compute_metrics
from pp_opt.ops import OpKey, Stream
from pp_opt.order import Order, Variant
from pp_opt.orders.offload.offload_warm import roomy
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, ScheduledOp, SolverInfo, Status
from pp_opt.simulator import simulate
from pp_opt.solvers.base import SolveOptions
from pp_opt.solvers.cpsat.model import CpsatModel, build_model

ORDERS_TRIED = 3
"""How many compute orders get a fixed-order solve (the fastest without copies first)."""

ORDER_SLACK = 1.05
"""Orders slower than the fastest by more than this factor (without copies) are not tried:
copies only add time, so they would not win (on the ``v`` offload instance the V-Min
orders, 10% slower than V-Half's at 1.5 times the room, stayed at 39.7-40.3 with copies)."""


def compute_orders(schedule: Schedule) -> list[list[OpKey]]:
    """Each device's compute-stream op keys in the order ``schedule`` runs them."""
    return [[op.key for op in schedule.stream_order(d, Stream.COMPUTE)]
            for d in range(schedule.problem.p)]  # fmt: skip


def order_makespan(problem: Problem, schedule: Schedule) -> float:
    """How fast ``schedule``'s compute order runs without caps and copies: what the copies
    of a fixed-order solve can at best keep (inf when it does not simulate)."""
    free = roomy(problem)
    streams = {(d, Stream.COMPUTE): keys for d, keys in enumerate(compute_orders(schedule))}
    order = Order(problem=free, streams=streams, variant=schedule.variant._replace(offload=False))
    try:
        return simulate(order).objective_value()
    except PPOptError:
        return float("inf")


def promising(problem: Problem, schedules: list[Schedule]) -> list[Schedule]:
    """Up to :data:`ORDERS_TRIED` schedules with distinct compute orders, the fastest order
    (without copies) first, none more than :data:`ORDER_SLACK` slower than it."""
    seen: set[str] = set()
    ranked: list[tuple[float, int, Schedule]] = []
    for n, schedule in enumerate(schedules):
        key = repr(compute_orders(schedule))
        if key in seen:
            continue
        seen.add(key)
        ranked.append((order_makespan(problem, schedule), n, schedule))
    ranked.sort(key=lambda item: (item[0], item[1]))
    if not ranked or ranked[0][0] == float("inf"):
        return []
    fastest = ranked[0][0]
    return [s for value, _, s in ranked[:ORDERS_TRIED] if value <= ORDER_SLACK * fastest]


def fix_compute_order(built: CpsatModel, schedule: Schedule) -> None:
    """Each compute op of the model starts after the one before it in ``schedule``'s order."""
    ops = built.vars.ops
    for keys in compute_orders(schedule):
        for a, b in zip(keys, keys[1:], strict=False):
            if a in ops and b in ops:
                built.model.add(ops[b].start >= ops[a].start + ops[a].size)


def fixed_order_model(
    problem: Problem, dag: nx.DiGraph, options: SolveOptions, schedule: Schedule, deadline: float
) -> CpsatModel:
    """The full model hinted by ``schedule`` and held to its compute order."""
    built = build_model(problem, dag, replace(options, warm_start=schedule), deadline=deadline)
    fix_compute_order(built, schedule)
    return built


def as_schedule(problem: Problem, ops: tuple[ScheduledOp, ...], variant: Variant) -> Schedule:
    """A backend's ops as a schedule to hint the next model with (times as solved)."""
    info = SolverInfo(name="cpsat", status=Status.FEASIBLE, objective=0.0)
    return Schedule(problem=problem, ops=ops, solver=info, metrics=compute_metrics(problem, ops),
                    variant=variant)  # fmt: skip


__all__ = [
    "ORDERS_TRIED",
    "ORDER_SLACK",
    "as_schedule",
    "compute_orders",
    "fix_compute_order",
    "fixed_order_model",
    "order_makespan",
    "promising",
]
