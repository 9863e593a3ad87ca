"""CP-SAT variables: one interval per op (optional ones for offload, reload and recompute)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import networkx as nx
from ortools.sat.python import cp_model, cp_model_helper

from pp_opt.ops import OpKey, OpKind, Stream, duration
from pp_opt.problem import Problem
from pp_opt.solvers.cpsat.scaling import Scaling

Lit = bool | cp_model.IntVar | cp_model_helper.Literal
"""A pair's order: fixed (True/False) or a literal for "the first ends before the other"."""

Before = dict[tuple[OpKey, OpKey], Lit]
"""The order of each pair of a device's compute ops (:mod:`.sequence`, :mod:`.relaxation`)."""


@dataclass(kw_only=True, slots=True)
class OpVar:
    """An op placed on its stream: start, fixed integer size, interval, presence."""

    key: OpKey
    device: int
    stream: Stream
    start: cp_model.IntVar
    size: int
    interval: cp_model.IntervalVar
    present: cp_model.IntVar | None = None
    """None for ops every schedule has; a literal for optional ones."""
    fraction: float = 1.0
    end_var: cp_model.IntVar | None = None
    """Its end where it may run in an overlapped pair (:mod:`.pairs`): then the pair's."""

    @property
    def end(self) -> cp_model.LinearExprT:
        return self.start + self.size if self.end_var is None else self.end_var


@dataclass(kw_only=True, slots=True)
class PairVar:
    """One candidate overlapped pair (:mod:`.pairs`): its halves, literal, size, interval."""

    forward: OpVar
    backward: OpVar
    literal: cp_model.IntVar
    size: int
    interval: cp_model.IntervalVar


OpRef = tuple[OpVar, bool]
"""An op variable and whether its end (True) or its start (False) is meant."""


@dataclass(kw_only=True, slots=True)
class OffloadChoice:
    """Offload then reload a fraction of one activation (both present iff ``literal``)."""

    fraction: float
    literal: cp_model.IntVar
    offload: OpVar
    reload: OpVar


@dataclass(kw_only=True, slots=True)
class Variables:
    """Everything the constraints and the objective refer to."""

    problem: Problem
    scaled: Problem
    """The problem with times in integer model units (memory unchanged)."""
    scaling: Scaling
    horizon: int
    ops: dict[OpKey, OpVar] = field(default_factory=dict)
    """Required ops and the optional ``R`` ops."""
    offloads: dict[tuple[int, int], list[OffloadChoice]] = field(default_factory=dict)
    keep: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    """Literal "activation kept", for activations that have another choice."""
    lifetimes: list[tuple[cp_model.IntVar, OpRef, OpRef]] = field(default_factory=list)
    """``(size, alloc, free)`` of each memory interval; ``alloc``/``free`` are ``(op, at_end)``."""
    orders: dict[tuple[OpKey, OpKey], cp_model.IntVar] = field(default_factory=dict)
    """Literal "``a`` ends before ``b`` starts" of the sequence memory model, per pair of
    compute ops of one device that nothing orders already (:mod:`.sequence`)."""
    span_vars: dict[int, tuple[cp_model.IntVar, cp_model.IntVar]] = field(default_factory=dict)
    """Per device, first start and last end (``span`` objective only)."""
    pairs: list[PairVar] = field(default_factory=list)
    """The candidate overlapped pairs (:mod:`.pairs`)."""
    alone: dict[OpKey, cp_model.IntVar] = field(default_factory=dict)
    """Literal "runs alone, not in a pair", for each half of a candidate pair."""

    def vars_of(self, key: OpKey) -> list[OpVar]:
        """Every variable copy of an op (one per offload fraction for copies)."""
        if key.kind in (OpKind.OFFLOAD, OpKind.RELOAD):
            choices = self.offloads.get((key.stage, key.microbatch), [])
            return [c.offload if key.kind is OpKind.OFFLOAD else c.reload for c in choices]
        return [self.ops[key]] if key in self.ops else []

    def all_op_vars(self) -> list[OpVar]:
        copies = [v for cs in self.offloads.values() for c in cs for v in (c.offload, c.reload)]
        return list(self.ops.values()) + copies


def scaled_problem(problem: Problem, scaling: Scaling) -> Problem:
    """The problem with every time rounded to integer model units."""

    def t(value: float) -> float:
        return float(scaling.t(value))

    stages = tuple(
        replace(
            st,
            t_f=t(st.t_f),
            t_b=t(st.t_b),
            t_w=t(st.t_w),
            t_bw=None if st.t_bw is None else t(st.t_bw),
            t_offload=t(st.t_offload),
            t_reload=t(st.t_reload),
            t_f_comm=min(t(st.t_f_comm), t(st.t_f)),
            t_b_comm=min(t(st.t_b_comm), t(st.t_b)),
        )
        for st in problem.stages
    )
    return problem.replace(stages=stages, t_comm=t(problem.t_comm))


def serial_horizon(scaled: Problem, dag: nx.DiGraph, fractions: Sequence[float]) -> int:
    """Running every op one after another (copies at the largest fraction) fits in this."""
    total = 0.0
    top = max(fractions) if fractions else 1.0
    for key in dag.nodes:
        total += duration(scaled, key.kind, key.stage, top)
    total += sum(lat for _, _, lat in dag.edges(data="latency"))
    return int(total) + 1


def _op_var(
    model: cp_model.CpModel,
    v: Variables,
    key: OpKey,
    data: dict[str, Any],
    *,
    literal: cp_model.IntVar | None = None,
    fraction: float = 1.0,
) -> OpVar:
    size = int(round(duration(v.scaled, key.kind, key.stage, fraction)))
    name = f"{key.kind.value}_{key.stage}_{key.microbatch}"
    if literal is not None and key.kind in (OpKind.OFFLOAD, OpKind.RELOAD):
        name += f"_{fraction:g}"
    start = model.new_int_var(0, max(0, v.horizon - size), f"s_{name}")
    if literal is None:
        interval = model.new_fixed_size_interval_var(start, size, f"i_{name}")
    else:
        interval = model.new_optional_fixed_size_interval_var(start, size, literal, f"i_{name}")
    return OpVar(
        key=key,
        device=data["device"],
        stream=data["stream"],
        start=start,
        size=size,
        interval=interval,
        present=literal,
        fraction=fraction,
    )


def create_variables(
    model: cp_model.CpModel,
    problem: Problem,
    dag: nx.DiGraph,
    scaling: Scaling,
    *,
    horizon: int,
    fractions: Sequence[float],
) -> Variables:
    """Intervals for every op of the DAG, and the keep / offload / recompute literals."""
    v = Variables(
        problem=problem, scaled=scaled_problem(problem, scaling), scaling=scaling, horizon=horizon
    )
    with_offload = bool(dag.graph.get("offload"))
    with_recompute = bool(dag.graph.get("recompute"))
    for key, data in dag.nodes(data=True):
        if key.kind in (OpKind.OFFLOAD, OpKind.RELOAD):
            continue
        literal = (
            model.new_bool_var(f"r_{key.stage}_{key.microbatch}") if key.kind is OpKind.R else None
        )
        v.ops[key] = _op_var(model, v, key, data, literal=literal)
    if with_offload:
        for s in range(problem.num_stages):
            for j in range(problem.m):
                choices = []
                for a in fractions:
                    lit = model.new_bool_var(f"o_{s}_{j}_{a:g}")
                    off_key = OpKey(OpKind.OFFLOAD, s, j)
                    rel_key = OpKey(OpKind.RELOAD, s, j)
                    off = _op_var(model, v, off_key, dag.nodes[off_key], literal=lit, fraction=a)
                    rel = _op_var(model, v, rel_key, dag.nodes[rel_key], literal=lit, fraction=a)
                    choices.append(OffloadChoice(fraction=a, literal=lit, offload=off, reload=rel))
                v.offloads[(s, j)] = choices
    if with_offload or with_recompute:
        for s in range(problem.num_stages):
            for j in range(problem.m):
                v.keep[(s, j)] = model.new_bool_var(f"k_{s}_{j}")
    return v
