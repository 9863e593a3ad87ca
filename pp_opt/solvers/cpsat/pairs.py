"""Overlapped pairs as a decision of the CP-SAT model (docs/design.md §3).

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

Candidates: :mod:`pp_opt.solvers.pairing` (the same as the MILP's).
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from pp_opt.ops import OpKey, OpKind, Stream, pair_time
from pp_opt.schedule import ScheduledOp
from pp_opt.solvers.cpsat.variables import OpVar, PairVar, Variables


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
