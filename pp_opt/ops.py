"""Op kinds and streams, and the one place that says what an op costs (docs/design.md §3).

Solvers, simulator, validator and exporters all ask :func:`duration` and
:func:`memory_delta`; nothing else may restate these rules.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from pp_opt.problem import Problem


class OpKind(StrEnum):
    F = "F"
    B = "B"
    W = "W"
    BW = "BW"
    OFFLOAD = "OFFLOAD"
    RELOAD = "RELOAD"
    R = "R"


class Stream(StrEnum):
    COMPUTE = "compute"
    D2H = "d2h"
    H2D = "h2d"


STREAM_ORDER = (Stream.COMPUTE, Stream.D2H, Stream.H2D)
"""The order streams are listed in when two ops start at the same time."""

BACKWARD_KINDS = (OpKind.B, OpKind.BW)
"""Kinds that carry the gradient upstream (one of them exists per stage and microbatch)."""


class OpKey(NamedTuple):
    """Identifies one op of one iteration; the node key of the DAG."""

    kind: OpKind
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind.value}(stage={self.stage}, mb={self.microbatch})"


def stream_of(kind: OpKind) -> Stream:
    if kind is OpKind.OFFLOAD:
        return Stream.D2H
    if kind is OpKind.RELOAD:
        return Stream.H2D
    return Stream.COMPUTE


def duration(problem: Problem, kind: OpKind, stage: int, fraction: float = 1.0) -> float:
    """Time the op occupies its stream; copies scale with the offloaded ``fraction``."""
    st = problem.stages[stage]
    match kind:
        case OpKind.F | OpKind.R:
            return st.t_f
        case OpKind.B:
            return st.t_b
        case OpKind.W:
            return st.t_w
        case OpKind.BW:
            return st.fused_backward
        case OpKind.OFFLOAD:
            return fraction * st.t_offload
        case OpKind.RELOAD:
            return fraction * st.t_reload
    raise ValueError(f"unknown op kind {kind!r}")


def memory_delta(
    problem: Problem,
    kind: OpKind,
    stage: int,
    *,
    fraction: float = 1.0,
    recomputed: bool = False,
) -> tuple[float, float]:
    """Memory change of an op on its device: ``(at its start, at its end)``.

    ``recomputed`` says that this stage and microbatch has an ``R`` op, so its
    ``F`` keeps only the input ``m_in`` and ``R`` brings back the rest.
    """
    st = problem.stages[stage]
    match kind:
        case OpKind.F:
            return (st.m_in if recomputed else st.m_b), 0.0
        case OpKind.R:
            return st.m_b - st.m_in, 0.0
        case OpKind.B:
            return 0.0, -(st.m_b - st.m_w)
        case OpKind.W:
            return 0.0, -st.m_w
        case OpKind.BW:
            return 0.0, -st.m_b
        case OpKind.OFFLOAD:
            return 0.0, -fraction * st.m_b
        case OpKind.RELOAD:
            return fraction * st.m_b, 0.0
    raise ValueError(f"unknown op kind {kind!r}")
