"""What every check needs: the DAG of the schedule's variant, its ops, and the tolerances."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from pp_opt.dag import dag_for
from pp_opt.ops import OpKey, OpKind
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, ScheduledOp
from pp_opt.time_rule import time_slack


@dataclass(kw_only=True, slots=True)
class Context:
    """A schedule prepared for checking; built once by :func:`make_context`."""

    problem: Problem
    dag: nx.DiGraph
    """The DAG variant (fused or split, with or without offload and recompute) of the ops."""
    ops: tuple[ScheduledOp, ...]
    """Every op of the schedule, as it is."""
    placed: list[ScheduledOp]
    """Ops on an existing stage with finite times: those that occupy a stream (an
    overlapped pair is one op here)."""
    by_device: list[list[ScheduledOp]]
    """The DAG ops of ``placed`` (each pair as its two halves, :meth:`ScheduledOp.halves`)
    split by device: what holds memory (checks walk one device at a time)."""
    first: dict[OpKey, ScheduledOp]
    """The earliest copy of each placed DAG op (pair halves included)."""
    recomputed: set[tuple[int, int]]
    """(stage, microbatch) pairs with an ``R`` op: their ``F`` keeps only ``m_in``."""
    time_tol: float
    """Slack for comparing times: ``tol * max(1, latest time)``
    (:func:`pp_opt.time_rule.time_slack`)."""
    memory_tol: float
    """Slack for comparing memory: ``tol * max(1, largest cap)``."""
    tol: float
    """The relative tolerance itself (for ratios such as ``bubble_rate``)."""
    memory_events: dict[int, Any] = field(default_factory=dict)
    """Per device, its sorted memory events once a check has listed them (two checks do)."""

    def device_of(self, op: ScheduledOp) -> int:
        return self.problem.device_of(op.stage)


def is_placed(problem: Problem, op: ScheduledOp) -> bool:
    """On a stage of the problem, with finite start and end."""
    return 0 <= op.stage < problem.num_stages and math.isfinite(op.start) and math.isfinite(op.end)


def make_context(schedule: Schedule, tol: float) -> Context:
    problem = schedule.problem
    dag = dag_for(problem, schedule.variant)
    placed = [op for op in schedule.ops if is_placed(problem, op)]
    halves = [half for op in placed for half in op.halves() if is_placed(problem, half)]
    by_device: list[list[ScheduledOp]] = [[] for _ in range(problem.p)]
    for op in halves:
        by_device[problem.device_of(op.stage)].append(op)
    first: dict[OpKey, ScheduledOp] = {}
    for op in sorted(halves, key=lambda o: (o.start, o.end)):
        key = op.key
        if key in dag:
            first.setdefault(key, op)
    largest_cap = max(device.cap for device in problem.devices)
    return Context(
        problem=problem,
        dag=dag,
        ops=schedule.ops,
        placed=placed,
        by_device=by_device,
        first=first,
        recomputed={(k.stage, k.microbatch) for k in first if k.kind is OpKind.R},
        time_tol=time_slack(placed, tol),
        memory_tol=tol * max(1.0, largest_cap),
        tol=tol,
    )
