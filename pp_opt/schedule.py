"""Timed schedules: the ops with their start and end, how they were made, and their metrics."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pp_opt.ops import STREAM_ORDER, OpKey, OpKind, Stream
from pp_opt.order import Variant
from pp_opt.problem import Problem


class Status(StrEnum):
    """How a schedule's maker ended (written to JSON as the plain string)."""

    OPTIMAL = "optimal"
    """A solver proved no schedule is better."""
    FEASIBLE = "feasible"
    """Valid, not proved optimal (the time limit came first)."""
    TIMEOUT = "timeout"
    """A backend found nothing in time (only ever a backend's own status)."""
    INFEASIBLE = "infeasible"
    """A backend proved nothing fits (only ever a backend's own status)."""
    HEURISTIC = "heuristic"
    """Made by a fixed pattern or a greedy rule (baselines, warm starts)."""


@dataclass(frozen=True, slots=True)
class ScheduledOp:
    """One op placed in time on its device's stream."""

    kind: OpKind
    stage: int
    microbatch: int
    stream: Stream
    start: float
    end: float
    fraction: float = 1.0
    """Part of the activation moved, for ``OFFLOAD`` and ``RELOAD``."""
    partner: OpKey | None = None
    """For an overlapped pair ``FB`` (whose ``stage`` and ``microbatch`` are its ``F``
    half's), its backward half: ``B`` or ``BW`` of another stage and microbatch."""

    @property
    def key(self) -> OpKey:
        return OpKey(self.kind, self.stage, self.microbatch)

    @property
    def order_key(self) -> OpKey:
        """The key an :class:`~pp_opt.order.Order` lists it under: its own, or for a pair
        its ``F`` half's (:attr:`pp_opt.order.Order.pairs` names the backward half)."""
        return OpKey(OpKind.F, self.stage, self.microbatch) if self.partner else self.key

    def halves(self) -> tuple[ScheduledOp, ...]:
        """The DAG ops this op runs: itself, or a pair's two halves, each over the pair's
        whole time (each waits for what it waits for, and its successors for the end)."""
        if self.partner is None:
            return (self,)
        back = self.partner
        return (
            ScheduledOp(OpKind.F, self.stage, self.microbatch, self.stream, self.start, self.end),
            ScheduledOp(back.kind, back.stage, back.microbatch, self.stream, self.start, self.end),
        )

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(kw_only=True, slots=True)
class SolverInfo:
    """How a schedule was made: by which solver or baseline, with what outcome."""

    name: str
    status: Status
    objective: float
    lower_bound: float | None = None
    gap: float | None = None
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    """Further keys kept as they are (solver options, warm start, ...)."""


@dataclass(kw_only=True, slots=True)
class Metrics:
    """The metrics of docs/design.md §4."""

    makespan: float
    span: list[float]
    bubble_rate: float
    idle_fraction: float
    peak_memory: list[float]
    busy: list[float]
    """Compute-stream time of each device."""


@dataclass(kw_only=True, slots=True)
class Schedule:
    """A timed schedule of one problem: every op with its start and end, the metrics they
    imply, and how the schedule was made (``solver``).

    Schedules come from :func:`pp_opt.solve`, :func:`pp_opt.baseline`,
    :func:`pp_opt.simulate` and :func:`pp_opt.load_schedule`; :func:`pp_opt.validate`
    re-checks one, and :func:`pp_opt.save_schedule` writes it (valid ones only)."""

    problem: Problem
    ops: tuple[ScheduledOp, ...]
    solver: SolverInfo
    metrics: Metrics
    variant: Variant
    """The DAG its ops belong to (set by whoever makes the schedule; checks use it)."""

    def device_ops(self, device: int) -> list[ScheduledOp]:
        """Ops of one device in execution order (start, then stream, then end)."""
        own = [op for op in self.ops if self.problem.device_of(op.stage) == device]
        return sorted(own, key=execution_order_key)

    def by_device(self) -> list[list[ScheduledOp]]:
        """:meth:`device_ops` of every device, in one pass over the ops."""
        rows: list[list[ScheduledOp]] = [[] for _ in range(self.problem.p)]
        for op in self.ops:
            rows[self.problem.device_of(op.stage)].append(op)
        for row in rows:
            row.sort(key=execution_order_key)
        return rows

    def stream_order(self, device: int, stream: Stream) -> list[ScheduledOp]:
        return [op for op in self.device_ops(device) if op.stream is stream]

    def objective_value(self, objective: str | None = None) -> float:
        objective = objective or self.problem.objective
        return self.metrics.makespan if objective == "makespan" else max(self.metrics.span)


def execution_order_key(op: ScheduledOp) -> tuple[float, int, float, int, int]:
    return (op.start, STREAM_ORDER.index(op.stream), op.end, op.stage, op.microbatch)


def dag_ops(ops: Iterable[ScheduledOp]) -> list[ScheduledOp]:
    """The ops, each overlapped pair as its two halves (:meth:`ScheduledOp.halves`)."""
    return [half for op in ops for half in op.halves()]
