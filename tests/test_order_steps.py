"""Order literals follow the fixed orders (:func:`pp_opt.solvers.cpsat.sequence.add_order_steps`).

- The rule by hand: ``a`` before ``b`` and ``b`` fixed before ``c`` leave no room for ``c``
  before ``a``; ops of zero duration get no implication.
- No valid schedule is lost: V-Half, V-Min and ZB-V (their ``W`` in the order the model
  states), fixed in time in the full sequence model at their own peak memory, are solutions.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from families import exact_family
from ortools.sat.python import cp_model

from pp_opt import baseline
from pp_opt.dag import dag_for
from pp_opt.ops import OpKey, OpKind, Stream
from pp_opt.order import Order
from pp_opt.problem import Device
from pp_opt.simulator import order_of, simulate
from pp_opt.solvers.base import SolveOptions
from pp_opt.solvers.cpsat.model import build_model
from pp_opt.solvers.cpsat.sequence import add_order_steps
from pp_opt.solvers.cpsat.variables import Before
from pp_opt.solvers.cpsat.w_order import in_w_order, w_class

F, B = OpKind.F, OpKind.B


@dataclass
class _Op:
    key: OpKey
    size: int


def _three(size_c: int = 10) -> tuple[cp_model.CpModel, Before, list[_Op]]:
    """Ops a, b, c of one device with ``b`` fixed before ``c``; the other pairs free."""
    a, b, c = _Op(OpKey(F, 1, 0), 10), _Op(OpKey(F, 0, 1), 10), _Op(OpKey(B, 0, 0), size_c)
    model = cp_model.CpModel()
    before: Before = {(b.key, c.key): True, (c.key, b.key): False}
    for x, y in ((a, b), (a, c)):
        lit = model.new_bool_var(f"{x.key}<{y.key}")
        before[(x.key, y.key)], before[(y.key, x.key)] = lit, ~lit
    return model, before, [a, b, c]


def _feasible(model: cp_model.CpModel) -> bool:
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    return solver.solve(model) in (cp_model.OPTIMAL, cp_model.FEASIBLE)


@pytest.mark.parametrize(
    "a_before_b,a_before_c,size_c,feasible",
    [
        (1, 0, 10, False),  # a before b and b fixed before c leave no room for c before a
        (0, 0, 10, True),  # with b before a, c may come before a
        (1, 0, 0, True),  # ops of zero duration get no implication
    ],
)
def test_an_order_steps_along_the_fixed_orders(
    a_before_b: int, a_before_c: int, size_c: int, feasible: bool
) -> None:
    model, before, ops = _three(size_c)
    a, b, c = (o.key for o in ops)
    add_order_steps(model, [o.key for o in ops if o.size > 0], before)
    model.add(before[(a, b)] == a_before_b)
    model.add(before[(a, c)] == a_before_c)
    assert _feasible(model) is feasible


@pytest.mark.parametrize("rule", ["v-half", "v-min", "zb-v"])
def test_classic_schedules_stay_solutions_at_their_own_peak(rule: str) -> None:
    problem = exact_family(4, 8, 4.0)
    order = order_of(baseline(rule, problem))
    streams = {
        key: in_w_order(keys, w_class(problem)) if key[1] is Stream.COMPUTE else keys
        for key, keys in order.streams.items()
    }
    schedule = simulate(Order(problem=problem, streams=streams, fractions=order.fractions,
                              waits=order.waits, variant=order.variant))  # fmt: skip
    tight = problem.replace(devices=tuple(Device(cap=max(schedule.metrics.peak_memory))
                                          for _ in problem.devices))  # fmt: skip
    options = SolveOptions(threads=1, memory_model="sequence")
    built = build_model(tight, dag_for(tight), options)
    at = {op.key: op.start for op in schedule.ops}
    for key, op in built.vars.ops.items():
        built.model.add(op.start == round(at[key] * built.scaling.time))
    assert _feasible(built.model), rule
