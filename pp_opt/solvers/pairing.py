"""Which overlapped pairs a solver's model may form (docs/design.md §3), for CP-SAT and the MILP.

Candidates: only pairs that save time (communication to hide), of two stages of one
device, and ``F(s, i)`` with a backward (``B``, or ``BW`` when fused) of an earlier
microbatch ``j`` in ``i - window <= j < i``: with the microbatches of each kind and stage
in order (the models' symmetry breaking), a backward of a later microbatch waits for
``F(s, j)``, which follows ``F(s, i)``, so it can never pair with it. :data:`PAIR_WINDOW`
stages' worth of microbatches keeps the models small; when the window holds every
earlier microbatch (:func:`complete`), a model has every pair a schedule can form.
"""

from __future__ import annotations

import networkx as nx

from pp_opt.ops import OpKey, OpKind, duration, has_pair_savings, pair_time
from pp_opt.problem import Problem

PAIR_WINDOW = 2
"""A candidate pairs ``F(s, i)`` with backwards of the ``PAIR_WINDOW * S`` microbatches
before ``i`` (``S`` stages): the in-flight microbatches of the classic schedules."""


def window(problem: Problem) -> int:
    """How many earlier microbatches' backwards a forward may pair with."""
    return min(problem.m - 1, PAIR_WINDOW * problem.num_stages)


def complete(problem: Problem) -> bool:
    """Whether the candidates hold every pair a schedule can form (see the module)."""
    return window(problem) >= problem.m - 1


def candidates(problem: Problem, dag: nx.DiGraph) -> list[tuple[OpKey, OpKey]]:
    """``(F key, backward key)`` of every candidate pair; none without ``problem.pairs``
    or without communication to hide."""
    if not problem.pairs or not has_pair_savings(problem):
        return []
    back = OpKind.B if dag.graph.get("split_backward") else OpKind.BW
    k = window(problem)
    found = []
    for device in range(problem.p):
        own = problem.stages_on(device)
        for s in own:
            for s2 in own:
                serial = duration(problem, OpKind.F, s) + duration(problem, back, s2)
                if pair_time(problem, s, s2, back) >= serial:
                    continue  # nothing to hide: running the halves apart is never worse
                for i in range(problem.m):
                    for j in range(max(0, i - k), i):
                        found.append((OpKey(OpKind.F, s, i), OpKey(back, s2, j)))
    return found
