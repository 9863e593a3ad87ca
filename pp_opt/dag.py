"""The op DAG of one training iteration: the single source of every dependency.

Nodes are :class:`~pp_opt.ops.OpKey`; each carries ``kind``, ``stage``,
``microbatch``, ``device``, ``stream``, ``duration`` (of a whole-activation
copy for offload ops), ``mem_start``/``mem_end`` (without recompute) and
``optional`` (offload, reload and recompute ops exist only where chosen).
Edges carry ``latency``: ``t_comm`` between devices, 0 on one device.
"""

from __future__ import annotations

from functools import lru_cache

import networkx as nx

from pp_opt.ops import OpKey, OpKind, duration, memory_delta, stream_of
from pp_opt.order import Variant
from pp_opt.problem import Problem


def dag_for(problem: Problem, variant: Variant | None = None) -> nx.DiGraph:
    """The DAG of ``problem`` in ``variant`` (the problem's own by default), built once.

    Simulator, validator and solvers all ask here, so one solve builds each variant it
    uses once. The graph is frozen: it is shared, so nobody may change it.
    """
    return _cached_dag(problem, variant or Variant.of_problem(problem))


@lru_cache(maxsize=16)
def _cached_dag(problem: Problem, variant: Variant) -> nx.DiGraph:
    dag = build_dag(
        problem,
        split_backward=variant.split_backward,
        offload=variant.offload,
        recompute=variant.recompute,
    )
    return nx.freeze(dag)


def build_dag(
    problem: Problem,
    *,
    split_backward: bool | None = None,
    offload: bool | None = None,
    recompute: bool | None = None,
) -> nx.DiGraph:
    """Every op of one iteration and the edges between them (DESIGN.md §3).

    The keyword switches override the problem's own (baselines run a fused
    backward whatever the problem says, for example). Prefer :func:`dag_for`, which
    builds each variant of a problem once.
    """
    split = problem.split_backward if split_backward is None else split_backward
    with_offload = problem.offload if offload is None else offload
    with_recompute = problem.recompute if recompute is None else recompute
    back = OpKind.B if split else OpKind.BW
    last = problem.num_stages - 1

    dag = nx.DiGraph(problem=problem, split_backward=split, offload=with_offload,
                     recompute=with_recompute,
                     variant=Variant(split, with_offload, with_recompute))  # fmt: skip
    for s in range(problem.num_stages):
        kinds = [OpKind.F, back]
        if split:
            kinds.append(OpKind.W)
        if with_offload:
            kinds += [OpKind.OFFLOAD, OpKind.RELOAD]
        if with_recompute:
            kinds.append(OpKind.R)
        for j in range(problem.m):
            for kind in kinds:
                _add_op(dag, problem, OpKey(kind, s, j))

    def link(u: OpKey, w: OpKey) -> None:
        dag.add_edge(u, w, latency=latency(problem, u, w))

    for j in range(problem.m):
        for s in range(problem.num_stages):
            if s > 0:
                link(OpKey(OpKind.F, s - 1, j), OpKey(OpKind.F, s, j))
            if s < last:
                link(OpKey(back, s + 1, j), OpKey(back, s, j))
            else:
                link(OpKey(OpKind.F, s, j), OpKey(back, s, j))
            if split:
                link(OpKey(OpKind.B, s, j), OpKey(OpKind.W, s, j))
            if with_offload:
                link(OpKey(OpKind.F, s, j), OpKey(OpKind.OFFLOAD, s, j))
                link(OpKey(OpKind.OFFLOAD, s, j), OpKey(OpKind.RELOAD, s, j))
                link(OpKey(OpKind.RELOAD, s, j), OpKey(back, s, j))
            if with_recompute:
                link(OpKey(OpKind.F, s, j), OpKey(OpKind.R, s, j))
                link(OpKey(OpKind.R, s, j), OpKey(back, s, j))
    return dag


def latency(problem: Problem, u: OpKey, w: OpKey) -> float:
    """Latency of the dependency ``u -> w``: ``t_comm`` between devices, 0 on one device."""
    return problem.t_comm if problem.device_of(u.stage) != problem.device_of(w.stage) else 0.0


def _add_op(dag: nx.DiGraph, problem: Problem, key: OpKey) -> None:
    mem_start, mem_end = memory_delta(problem, key.kind, key.stage)
    dag.add_node(
        key,
        kind=key.kind,
        stage=key.stage,
        microbatch=key.microbatch,
        device=problem.device_of(key.stage),
        stream=stream_of(key.kind),
        duration=duration(problem, key.kind, key.stage),
        mem_start=mem_start,
        mem_end=mem_end,
        optional=key.kind in (OpKind.OFFLOAD, OpKind.RELOAD, OpKind.R),
    )


def required_ops(dag: nx.DiGraph) -> list[OpKey]:
    """Ops every schedule must contain (all but offload, reload and recompute)."""
    return [k for k, data in dag.nodes(data=True) if not data["optional"]]
