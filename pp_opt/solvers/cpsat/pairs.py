"""Overlapped pairs as a decision of the CP-SAT model (DESIGN.md §3).

With ``problem.pairs``, an ``F(s, i)`` and a backward (``B``, or ``BW`` when fused) of
``(s2, j)`` on one device may run as one op of :func:`pp_opt.ops.pair_time`. The model
gets, per candidate pair, a literal and an optional interval of the pair's size on the
device's compute stream; each half of a candidate gets an end variable and a literal
"runs alone":

- a half runs alone or in exactly one of its candidate pairs;
- alone, it holds the stream for its own size and ends at ``start + size``;
- in a pair, both halves start at the pair's start and end at its end, and only the pair
  holds the stream.

Everything else refers to an op's end (:attr:`~.variables.OpVar.end`: the end variable
where there is one), so the precedences (successors of either half wait for the pair's
end), the memory (the ``F`` half's allocation at the start, the backward half's free at
the end) and the objective follow unchanged.

Candidates: only pairs that save time (communication to hide), of two stages of one
device, and ``F(s, i)`` with a backward of an earlier microbatch ``j`` in ``i - window
<= j < i``: with the microbatches of each kind and stage in order (the symmetry
breaking), a backward of a later microbatch waits for ``F(s, j)``, which follows
``F(s, i)``, so it can never pair with it. :data:`PAIR_WINDOW` stages' worth of
microbatches keeps the model small; when the window holds every earlier microbatch
(:func:`complete`), the model has every pair a schedule can form.
"""

from __future__ import annotations

import networkx as nx
from ortools.sat.python import cp_model

from pp_opt.ops import OpKey, OpKind, Stream, duration, has_pair_savings, pair_time
from pp_opt.problem import Problem
from pp_opt.schedule import ScheduledOp
from pp_opt.solvers.cpsat.variables import OpVar, PairVar, Variables

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


def add_pairs(model: cp_model.CpModel, v: Variables, pairs: list[tuple[OpKey, OpKey]]) -> None:
    """The variables and constraints of the candidate ``pairs`` (see the module)."""
    of_op: dict[OpKey, list[cp_model.IntVar]] = {}
    for f_key, b_key in pairs:
        f, b = v.ops[f_key], v.ops[b_key]
        name = f"p_{f_key.stage}_{f_key.microbatch}_{b_key.stage}_{b_key.microbatch}"
        lit = model.new_bool_var(name)
        size = int(round(pair_time(v.scaled, f_key.stage, b_key.stage, b_key.kind)))
        interval = model.new_optional_fixed_size_interval_var(f.start, size, lit, f"i_{name}")
        for half in (f, b):
            _open(model, v, half)
            model.add(half.end == f.start + size).only_enforce_if(lit)
            of_op.setdefault(half.key, []).append(lit)
        model.add(b.start == f.start).only_enforce_if(lit)
        v.pairs.append(PairVar(forward=f, backward=b, literal=lit, size=size, interval=interval))
    for key, lits in of_op.items():
        model.add_exactly_one([v.alone[key], *lits])


def _open(model: cp_model.CpModel, v: Variables, op: OpVar) -> None:
    """Give ``op`` an end variable and a literal "runs alone" (once)."""
    if op.key in v.alone:
        return
    alone = model.new_bool_var(f"a_{op.key.kind.value}_{op.key.stage}_{op.key.microbatch}")
    name = f"{op.key.kind.value}_{op.key.stage}_{op.key.microbatch}"
    end = model.new_int_var(op.size, v.horizon, f"e_{name}")
    model.add(end == op.start + op.size).only_enforce_if(alone)
    op.end_var = end
    op.interval = model.new_optional_fixed_size_interval_var(op.start, op.size, alone,
                                                             f"ia_{name}")  # fmt: skip
    v.alone[op.key] = alone


def read_pairs(solver: cp_model.CpSolver, v: Variables, scale: float) -> list[ScheduledOp]:
    """The chosen pairs as ``FB`` ops (problem units); their halves are not listed apart."""
    found = []
    for pair in v.pairs:
        if solver.boolean_value(pair.literal):
            f, b = pair.forward.key, pair.backward.key
            start = solver.value(pair.forward.start)
            end = (start + pair.size) / scale
            found.append(ScheduledOp(OpKind.FB, f.stage, f.microbatch, Stream.COMPUTE,
                                     start / scale, end, partner=b))  # fmt: skip
    return found


def hint_pairs(model: cp_model.CpModel, v: Variables, chosen: set[tuple[OpKey, OpKey]]) -> None:
    """Hint each candidate's literal (chosen in the warm start or not) and each half's."""
    paired = {key for pair in chosen for key in pair}
    for pair in v.pairs:
        model.add_hint(pair.literal, (pair.forward.key, pair.backward.key) in chosen)
    for key, alone in v.alone.items():
        model.add_hint(alone, key not in paired)
