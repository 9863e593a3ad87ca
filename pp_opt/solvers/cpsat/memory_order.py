"""Orders the memory cap forces: a forward that cannot fit until a given op has ended.

With memory over the op sequence (:mod:`.sequence`; no offload, no recompute) a
device's memory at the start of a forward ``x`` is a sum over its lifetimes ``l``
(demand ``d_l``, allocated at the start of op ``a_l``, freed at the end of op
``f_l``)::

    sum of d_l over l with a_l = x or a_l before x, and not f_l before x  <=  room

Some lifetimes are allocated before ``x`` in every schedule: ``a_l`` is ``x`` or
precedes it through the DAG and the symmetry-breaking chains (each op kind of each
stage in microbatch order, :func:`~.constraints.symmetry_chains`). Call their set
``A``. Take an op ``y`` of the device's compute stream not yet ordered against ``x``.
If ``y`` does not end before ``x`` starts, the stream runs ``x`` first, so ``y`` and
every op after ``y`` come after ``x`` and have freed nothing at ``x``; the memory there
is then at least::

    sum of d_l over l in A whose f_l is y, after y, or after x

If that exceeds the room, no such schedule runs ``x`` before ``y``: ``y`` ends before
``x`` starts in every one of them. The pair is implied by the caps, the DAG and the
symmetry breaking, so stating it removes no schedule those keep (and the symmetry
breaking keeps an optimum). Each new pair grows the closure, so the pairs are derived
again until none is new.

On a ``v`` placement with tight memory the pairs tie each device's forwards to the
backwards of a few microbatches earlier (``F(s, j)`` after ``B(s, j - 2)``). The DAG
closed by them holds the pipeline's steady state: its longest paths (the op heads and
tails of :func:`~.objective.add_heads_and_tails`) couple the devices through memory,
which the DAG alone does not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import networkx as nx

from pp_opt.ops import OpKey, OpKind

__all__ = ["Lifetime", "memory_orders", "with_orders"]

Lifetime = tuple[int, OpKey, OpKey]
"""``(demand, alloc op, free op)`` of one memory lifetime, in a model's integer units."""


def memory_orders(
    graph: nx.DiGraph,
    device_ops: Mapping[int, Sequence[OpKey]],
    lifetimes: Mapping[int, Sequence[Lifetime]],
    rooms: Mapping[int, int],
) -> list[tuple[OpKey, OpKey]]:
    """The pairs ``(y, x)`` the caps force (``y`` ends before forward ``x`` starts), to a
    fixed point (module docstring).

    ``graph``: the orders every schedule keeps (the DAG and the symmetry-breaking chains);
    ``device_ops[d]``: the ops of ``d``'s compute stream; ``lifetimes[d]`` and
    ``rooms[d]``: its memory in one integer unit. Empty where the pairs would close a
    cycle (no schedule fits the caps; the solver finds that out itself).
    """
    closed = nx.DiGraph(graph)
    found: list[tuple[OpKey, OpKey]] = []
    while True:
        new = []
        for device, keys in sorted(device_ops.items()):
            after = {k: nx.descendants(closed, k) for k in keys}
            new += _forced(keys, after, lifetimes.get(device, ()), rooms[device])
        if not new:
            return found
        closed.add_edges_from(new)
        if not nx.is_directed_acyclic_graph(closed):
            return []
        found += new


def _forced(
    keys: Sequence[OpKey],
    after: Mapping[OpKey, set[OpKey]],
    lifetimes: Sequence[Lifetime],
    room: int,
) -> list[tuple[OpKey, OpKey]]:
    """One device's new forced pairs, given the ops after each of its ops."""
    pairs = []
    for x in keys:
        if x.kind is not OpKind.F:
            continue
        held = [(d, f) for d, a, f in lifetimes if a == x or x in after[a]]
        if sum(d for d, _f in held) <= room:
            continue
        for y in keys:
            if y == x or x in after[y] or y in after[x]:
                continue
            late = after[y] | after[x] | {y}
            if sum(d for d, f in held if f in late) > room:
                pairs.append((y, x))
    return pairs


def with_orders(dag: nx.DiGraph, pairs: Iterable[tuple[OpKey, OpKey]]) -> nx.DiGraph:
    """A copy of ``dag`` with each pair as an edge of latency 0 (the first ends before the
    second starts) where the DAG has no edge between them."""
    out = dag.copy()
    for a, b in pairs:
        if not out.has_edge(a, b):
            out.add_edge(a, b, latency=0.0)
    return out
