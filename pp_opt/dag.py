"""The op DAG of one training iteration: the single source of every dependency.

Nodes are :class:`~pp_opt.ops.OpKey`; each carries ``kind``, ``stage``,
``microbatch``, ``device``, ``stream``, ``duration`` (of a whole-activation
copy for offload ops), ``mem_start``/``mem_end`` (without recompute) and
``optional`` (offload, reload and recompute ops exist only where chosen).
Edges carry ``latency``: ``t_comm`` between devices, 0 on one device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache

import networkx as nx

from pp_opt.ops import (
    BACK,
    KINDS,
    Dep,
    OpKey,
    OpKind,
    duration,
    kinds_of,
    memory_delta,
    stream_of,
)
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
    """Every op of one iteration and the edges between them (docs/design.md §3).

    The keyword switches override the problem's own (baselines run a fused
    backward whatever the problem says, for example). Prefer :func:`dag_for`, which
    builds each variant of a problem once.
    """
    split = problem.split_backward if split_backward is None else split_backward
    with_offload = problem.offload if offload is None else offload
    with_recompute = problem.recompute if recompute is None else recompute

    dag = nx.DiGraph(problem=problem, split_backward=split, offload=with_offload,
                     recompute=with_recompute,
                     variant=Variant(split, with_offload, with_recompute))  # fmt: skip
    kinds = kinds_of(split, with_offload, with_recompute)
    back = OpKind.B if split else OpKind.BW
    m, stages = problem.m, range(problem.num_stages)
    # Each key is made once and an op's attributes once per (kind, stage): large problems
    # (hundreds of thousands of ops) build in about a second.
    keys = {kind: [[OpKey(kind, s, j) for j in range(m)] for s in stages] for kind in kinds}
    routes = problem.routes()  # the stages each microbatch runs through (all, but in dual)
    for s in stages:
        data = [(keys[kind][s], _op_data(problem, kind, s)) for kind in kinds]
        dag.add_nodes_from((row[j], {**shared, "microbatch": j}) for r, mbs in routes if s in r
                           for j in mbs for row, shared in data)  # fmt: skip
    lag = stage_latency(problem)
    edges = []
    for route, mbs in routes:
        first, last = route.start, route.stop - 1
        # Per stage, what each op waits for: (the other op's kind, its stage), from KINDS.
        rules = {s: [(kind, other, s + dep.stage if first <= s + dep.stage <= last else s)
                     for kind in kinds for dep in KINDS[kind].after
                     for other in [_dep_kind(dep, back, first <= s + dep.stage <= last)]
                     if other in keys] for s in route}  # fmt: skip
        edges += [(keys[other][t][j], keys[kind][s][j], {"latency": lag(t, s)})
                  for j in mbs for s in route for kind, other, t in rules[s]]  # fmt: skip
    dag.add_edges_from(edges)
    after: dict[OpKey, list[OpKey]] = {key: [] for key in dag}
    for u, w, _ in edges:
        after[u].append(w)
    dag.graph[_SUCCESSORS] = after  # what successors() would list, made while it is cheap
    return dag


def _dep_kind(dep: Dep, back: OpKind, inside: bool) -> OpKind | None:
    """The kind ``dep`` names in a DAG whose backward is ``back``; ``inside`` says whether
    its stage exists (otherwise the pipeline's end: ``dep.edge``)."""
    if not inside:
        return dep.edge
    return back if dep.kind == BACK else OpKind(dep.kind)


def stage_latency(problem: Problem) -> Callable[[int, int], float]:
    """:func:`latency` by the stages of the two ops, with the devices looked up once."""
    devices = [problem.device_of(s) for s in range(problem.num_stages)]
    t_comm = problem.t_comm

    def lag(a: int, b: int) -> float:
        return t_comm if devices[a] != devices[b] else 0.0

    return lag


def latency(problem: Problem, u: OpKey, w: OpKey) -> float:
    """Latency of the dependency ``u -> w``: ``t_comm`` between devices, 0 on one device."""
    return problem.t_comm if problem.device_of(u.stage) != problem.device_of(w.stage) else 0.0


def _op_data(problem: Problem, kind: OpKind, stage: int) -> dict[str, object]:
    """The node attributes an op of ``kind`` on ``stage`` has, whatever its microbatch."""
    mem_start, mem_end = memory_delta(problem, kind, stage)
    return {
        "kind": kind,
        "stage": stage,
        "device": problem.device_of(stage),
        "stream": stream_of(kind),
        "duration": duration(problem, kind, stage),
        "mem_start": mem_start,
        "mem_end": mem_end,
        "optional": KINDS[kind].optional,
    }


def successors(dag: nx.DiGraph) -> dict[OpKey, list[OpKey]]:
    """Each op's successors in ``dag``, as plain lists (kept with the DAG: a DAG of
    :func:`dag_for` is frozen, so they stay right; walking these is much faster than
    walking networkx's views on large DAGs)."""
    found: dict[OpKey, list[OpKey]] | None = dag.graph.get(_SUCCESSORS)
    if (
        found is None
        or not nx.is_frozen(dag)
        or len(found) != dag.number_of_nodes()
        or sum(map(len, found.values())) != dag.number_of_edges()
    ):
        found = {u: list(nbrs) for u, nbrs in dag.adjacency()}
        if nx.is_frozen(dag):
            dag.graph[_SUCCESSORS] = found
    return found


_SUCCESSORS = "successor_lists"


def op_count(problem: Problem, variant: Variant | None = None) -> int:
    """How many ops :func:`dag_for` ``(problem, variant)`` has, without building it."""
    variant = variant or Variant.of_problem(problem)
    runs = sum(len(route) * len(mbs) for route, mbs in problem.routes())
    return runs * len(variant.kinds())


def longest_paths(
    dag: nx.DiGraph, size: Mapping[OpKey, int], latency: Mapping[tuple[OpKey, OpKey], int]
) -> tuple[dict[OpKey, int], dict[OpKey, int]]:
    """``(head, tail)`` of each op in ``size``: its longest path from the sources (the
    earliest start of any schedule) and to the sinks (after its end), through the ops in
    ``size`` only, with their sizes and the edges' ``latency``."""
    order = [k for k in nx.topological_sort(dag) if k in size]
    head: dict[OpKey, int] = {}
    for k in order:
        head[k] = max((head[u] + size[u] + latency[(u, k)]
                       for u in dag.predecessors(k) if u in head), default=0)  # fmt: skip
    tail: dict[OpKey, int] = {}
    for k in reversed(order):
        tail[k] = max((latency[(k, w)] + size[w] + tail[w]
                       for w in dag.successors(k) if w in tail), default=0)  # fmt: skip
    return head, tail


def required_ops(dag: nx.DiGraph) -> list[OpKey]:
    """Ops every schedule must contain (all but offload, reload and recompute)."""
    return [k for k, data in dag.nodes(data=True) if not data["optional"]]
