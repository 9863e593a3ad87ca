"""Op kinds and streams, and the one place that says what an op costs (docs/design.md §3).

:data:`KINDS` gives each op kind one row: the stream it holds, when a DAG has it, whether
it is optional, its memory effect and the ops it waits for. :data:`STREAMS` says which
streams are host copies (sharing a host link). Everything else is derived from these two
tables: the DAG's nodes and edges (:mod:`pp_opt.dag`), the resource an op holds
(:func:`resource_of`, for the solvers, the simulator and the validator), which kinds
allocate and which free (:data:`ALLOCATING`, :data:`FREEING`). Solvers, simulator,
validator and exporters ask :func:`duration` and :func:`memory_delta`; nothing else may
restate these rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import NamedTuple

from pp_opt.problem import Problem, Stage


class OpKind(StrEnum):
    F = "F"
    B = "B"
    W = "W"
    BW = "BW"
    OFFLOAD = "OFFLOAD"
    RELOAD = "RELOAD"
    R = "R"
    FB = "FB"
    """An overlapped pair: the ``F`` of one microbatch with the backward (``B`` or ``BW``)
    of another on the same device, one op of the compute stream (docs/design.md §3)."""


class Stream(StrEnum):
    COMPUTE = "compute"
    D2H = "d2h"
    H2D = "h2d"


@dataclass(frozen=True, slots=True)
class StreamRow:
    """What a stream is: its place among a device's streams and whether it copies."""

    stream: Stream
    host_copy: bool
    """Copies between device and host: devices in one host-link group share it."""


STREAMS = {
    Stream.COMPUTE: StreamRow(Stream.COMPUTE, host_copy=False),
    Stream.D2H: StreamRow(Stream.D2H, host_copy=True),
    Stream.H2D: StreamRow(Stream.H2D, host_copy=True),
}
"""One row per stream, in the order streams are listed."""

STREAM_ORDER = tuple(STREAMS)
"""The order streams are listed in when two ops start at the same time."""

BACK = "back"
"""In a :class:`Dep`, the backward kind of the DAG: ``B`` when split, ``BW`` when fused."""


@dataclass(frozen=True, slots=True)
class Dep:
    """One rule "an op of this kind waits for ``kind`` (of the same microbatch) to end".

    ``stage`` is the other op's stage relative to this one's (-1 the stage before, +1 the
    stage after); where that stage does not exist, ``edge`` (the pipeline's end) names
    the kind of the same stage it waits for instead, or None for no dependency.
    """

    kind: OpKind | str
    stage: int = 0
    edge: OpKind | None = None


Amount = Callable[[Stage, float, bool], float]
"""A memory amount of a stage's op: ``(stage costs, offloaded fraction, recomputed)``."""


@dataclass(frozen=True, slots=True)
class KindRow:
    """Everything pp_opt knows about one op kind (docs/design.md §3)."""

    kind: OpKind
    stream: Stream
    """The stream the op holds while it runs."""
    when: str
    """Which DAGs have it: ``always``, ``split`` or ``fused`` (by the backward split),
    ``offload`` or ``recompute`` (by those switches); ``pair`` never: a pair is no node
    of the DAG but two of them run as one op."""
    optional: bool
    """Present only where a schedule chooses it (copies, recompute, pairs)."""
    cost: Callable[[Stage], float] | None
    """Its duration (of a whole-activation copy for copies; they scale by the fraction);
    None for a pair (:func:`pair_time`)."""
    at_start: Amount | None
    """Memory it allocates at its start, or None."""
    at_end: Amount | None
    """Memory it frees at its end (a positive amount), or None."""
    after: tuple[Dep, ...]
    """What it waits for, in the order the DAG lists the edges."""
    scales: bool = False
    """Its cost and memory scale with the offloaded fraction."""
    halves: tuple[OpKind | str, ...] = ()
    """For a pair, the kinds it runs as one op: its memory effect is theirs (the ``F``
    half's allocation at the start, the backward half's free at the end) and it waits for
    what either half waits for; what waits for either half waits for its end."""


KINDS: dict[OpKind, KindRow] = {
    row.kind: row
    for row in (
        KindRow(OpKind.F, Stream.COMPUTE, "always", False, lambda st: st.t_f,
                at_start=lambda st, a, rec: st.m_in if rec else st.m_b, at_end=None,
                after=(Dep(OpKind.F, -1),)),
        KindRow(OpKind.B, Stream.COMPUTE, "split", False, lambda st: st.t_b,
                at_start=None, at_end=lambda st, a, rec: st.m_b - st.m_w,
                after=(Dep(BACK, +1, OpKind.F), Dep(OpKind.RELOAD), Dep(OpKind.R))),
        KindRow(OpKind.W, Stream.COMPUTE, "split", False, lambda st: st.t_w,
                at_start=None, at_end=lambda st, a, rec: st.m_w, after=(Dep(OpKind.B),)),
        KindRow(OpKind.BW, Stream.COMPUTE, "fused", False, lambda st: st.fused_backward,
                at_start=None, at_end=lambda st, a, rec: st.m_b,
                after=(Dep(BACK, +1, OpKind.F), Dep(OpKind.RELOAD), Dep(OpKind.R))),
        KindRow(OpKind.OFFLOAD, Stream.D2H, "offload", True, lambda st: st.t_offload,
                at_start=None, at_end=lambda st, a, rec: a * st.m_b,
                after=(Dep(OpKind.F),), scales=True),
        KindRow(OpKind.RELOAD, Stream.H2D, "offload", True, lambda st: st.t_reload,
                at_start=lambda st, a, rec: a * st.m_b, at_end=None,
                after=(Dep(OpKind.OFFLOAD),), scales=True),
        KindRow(OpKind.R, Stream.COMPUTE, "recompute", True, lambda st: st.t_f,
                at_start=lambda st, a, rec: st.m_b - st.m_in, at_end=None,
                after=(Dep(OpKind.F),)),
        KindRow(OpKind.FB, Stream.COMPUTE, "pair", True, None, at_start=None, at_end=None,
                after=(), halves=(OpKind.F, BACK)),
    )
}  # fmt: skip
"""One row per op kind (docs/design.md §3), in the order a DAG lists its ops."""

BACKWARD_KINDS = (OpKind.B, OpKind.BW)
"""Kinds that carry the gradient upstream (one of them exists per stage and microbatch)."""

ALLOCATING = tuple(kind for kind, row in KINDS.items() if row.at_start is not None)
"""Kinds that allocate at their start; memory can only peak right after one of them."""

FREEING = tuple(kind for kind, row in KINDS.items() if row.at_end is not None)
"""Kinds that free at their end."""

OPTIONAL = tuple(kind for kind, row in KINDS.items() if row.optional)
"""Kinds present only where a schedule chooses them."""

COPY_KINDS = tuple(kind for kind, row in KINDS.items() if STREAMS[row.stream].host_copy)
"""Kinds that copy between device and host."""


class OpKey(NamedTuple):
    """Identifies one op of one iteration; the node key of the DAG."""

    kind: OpKind
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind.value}(stage={self.stage}, mb={self.microbatch})"


def stream_of(kind: OpKind) -> Stream:
    return KINDS[kind].stream


Resource = tuple[str, int, Stream]
"""What an op holds while it runs: ``("device", device, stream)``, or ``("link", group,
stream)`` for a host copy of a device in a shared host-link group."""


def resource_of(problem: Problem, device: int, stream: Stream) -> Resource:
    """The resource an op on ``device``'s ``stream`` holds: its stream, or its shared host
    link for copies of devices in a host-link group (one copy per link and direction)."""
    if STREAMS[stream].host_copy:
        group = problem.link_group(device)
        if group is not None:
            return ("link", group, stream)
    return ("device", device, stream)


def kinds_of(split_backward: bool, offload: bool, recompute: bool) -> tuple[OpKind, ...]:
    """The kinds a DAG variant has, in :data:`KINDS` order."""
    on = {
        "always": True,
        "split": split_backward,
        "fused": not split_backward,
        "offload": offload,
        "recompute": recompute,
        "pair": False,
    }
    return tuple(kind for kind, row in KINDS.items() if on[row.when])


def duration(problem: Problem, kind: OpKind, stage: int, fraction: float = 1.0) -> float:
    """Time the op occupies its stream; copies scale with the offloaded ``fraction``."""
    row = KINDS.get(kind)
    if row is None or row.cost is None:
        raise ValueError(f"unknown op kind {kind!r}" if row is None else "a pair: see pair_time")
    cost = row.cost(problem.stages[stage])
    return fraction * cost if row.scales else cost


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
    row = KINDS.get(kind)
    if row is None:
        raise ValueError(f"unknown op kind {kind!r}")
    st = problem.stages[stage]
    at_start = row.at_start(st, fraction, recomputed) if row.at_start else 0.0
    at_end = -row.at_end(st, fraction, recomputed) if row.at_end else 0.0
    return at_start, at_end


def pair_time(problem: Problem, stage: int, stage_b: int, backward: OpKind) -> float:
    """How long an overlapped pair runs: ``F(stage)`` with ``backward`` (``B`` or ``BW``) of
    ``stage_b``, on one device (docs/design.md §3); the one place that says so.

    Each half is compute plus communication (``t_f_comm``, ``t_b_comm``); run together,
    each half's communication hides under the other's compute, which runs slower by
    ``pair_overhead`` while it has the communication beside it (the SMs the dispatch
    kernels hold). With ``Fc, Fm`` the forward's compute and communication and ``Bc, Bm``
    the backward's::

        t = Fc + Bc + max(0, Fm - Bc) + max(0, Bm - Fc)
              + pair_overhead * (min(Fm, Bc) + min(Bm, Fc))

    at most the two halves in sequence and at least the longer half's compute. Without
    communication a pair saves nothing.
    """
    if backward not in BACKWARD_KINDS:
        raise ValueError(f"a pair's backward half is B or BW, not {backward!r}")
    f, b = problem.stages[stage], problem.stages[stage_b]
    back = b.t_b if backward is OpKind.B else b.fused_backward
    f_comm, b_comm = f.t_f_comm, min(b.t_b_comm, back)
    f_compute, b_compute = f.t_f - f_comm, back - b_comm
    hidden = min(f_comm, b_compute) + min(b_comm, f_compute)
    overlapped = (
        f_compute + b_compute
        + max(0.0, f_comm - b_compute)
        + max(0.0, b_comm - f_compute)
        + problem.pair_overhead * hidden
    )  # fmt: skip
    return max(min(overlapped, f.t_f + back), f_compute, b_compute)


def has_pair_savings(problem: Problem) -> bool:
    """Whether an overlapped pair can run shorter than its halves in sequence (some stage
    has communication to hide)."""
    return any(st.t_f_comm > 0 or st.t_b_comm > 0 for st in problem.stages)


def pair_relaxed(problem: Problem) -> Problem:
    """A problem whose lower bounds hold for schedules with pairs: ``F`` and the backward
    ops cost what they may cost at least inside a pair, communication folded in.

    With ``Fc, Fm`` an ``F``'s compute and communication, ``Bc, Bm`` a backward's, and
    ``Bc*, Fc*`` the largest backward and forward compute of any stage on the same device
    (the only partners a pair can have), every pair of :func:`pair_time` lasts at least
    ``F' + B'`` with::

        F' = min(t_f, Fc + shown(Fm, Bc*))
        B' = min(back, Bc + shown(Bm, Fc*))
        shown(m, c) = min(m, max(0, m - c) + o * min(m, c))

    (``o`` the pair overhead): a half's communication shows past its partner's compute
    ``c`` or slows that compute while hidden under it, ``max(0, m - c) + o min(m, c)``,
    which is piecewise linear in ``c`` and so least at ``c = 0`` or ``c = Bc*``; the pair's
    time is the two halves' terms added, and the halves in sequence take ``t_f + back``.
    So running a pair's ``F`` and then its backward at these times inside the pair's
    interval turns any schedule with pairs into one of this problem that starts nothing
    later, frees nothing later and ends no later. The problem itself when nothing can be
    hidden (named baselines pair a problem's ops whether or not its solver may).
    """
    if not has_pair_savings(problem):
        return problem
    o = problem.pair_overhead
    f_compute = [st.t_f - st.t_f_comm for st in problem.stages]
    b_compute = [max(whole - min(st.t_b_comm, whole) for whole in (st.t_b, st.fused_backward))
                 for st in problem.stages]  # fmt: skip
    f_most: dict[int, float] = {}
    b_most: dict[int, float] = {}
    for st, fc, bc in zip(problem.stages, f_compute, b_compute, strict=True):
        f_most[st.device] = max(f_most.get(st.device, 0.0), fc)
        b_most[st.device] = max(b_most.get(st.device, 0.0), bc)

    def shown(comm: float, partner: float) -> float:
        return min(comm, max(0.0, comm - partner) + o * min(comm, partner))

    def back(whole: float, comm: float, device: int) -> float:
        comm = min(comm, whole)
        return min(whole, whole - comm + shown(comm, f_most[device]))

    stages = []
    for st, fc in zip(problem.stages, f_compute, strict=True):
        t_f = min(st.t_f, fc + shown(st.t_f_comm, b_most[st.device]))
        t_b = back(st.t_b, st.t_b_comm, st.device)
        t_bw = back(st.fused_backward, st.t_b_comm, st.device)
        stages.append(replace(st, t_f=t_f, t_b=t_b, t_bw=t_bw, t_f_comm=0.0, t_b_comm=0.0))
    return problem.replace(stages=tuple(stages))
