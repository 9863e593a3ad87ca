"""Alike ``W`` run in their backwards' order (:mod:`pp_opt.solvers.cpsat.w_order`, issue 28).

- A sequence worked by hand: the ``W`` slots keep their places and get their owners in
  the order of the ``B``.
- The reassignment keeps a schedule valid and as fast (classic rule schedules), and the
  solver's schedules keep the order.
- The symmetry loses no optimum: the sequence model (which states it) and the cumulative
  model (which does not) prove the same optima on small tight instances.
"""

from __future__ import annotations

import pytest
from families import exact_family

from pp_opt import baseline, validate
from pp_opt.dag import dag_for
from pp_opt.ops import OpKey, OpKind, Stream
from pp_opt.order import Order
from pp_opt.schedule import Schedule
from pp_opt.simulator import order_of, simulate
from pp_opt.solvers import solve
from pp_opt.solvers.base import SolveOptions
from pp_opt.solvers.cpsat import solve_cpsat
from pp_opt.solvers.cpsat.w_order import in_w_order, w_class

F, B, W = OpKind.F, OpKind.B, OpKind.W


def test_slots_keep_their_places_and_follow_the_backwards() -> None:
    problem = exact_family(2, 2, 4.0)
    seq = [OpKey(B, 3, 0), OpKey(B, 0, 0), OpKey(W, 0, 0), OpKey(F, 0, 1), OpKey(W, 3, 0)]
    assert in_w_order(seq, w_class(problem)) == [
        OpKey(B, 3, 0), OpKey(B, 0, 0), OpKey(W, 3, 0), OpKey(F, 0, 1), OpKey(W, 0, 0),
    ]  # fmt: skip


def _w_order_kept(schedule: Schedule) -> bool:
    """Whether each device runs its alike ``W`` in the order of their ``B``."""
    alike = w_class(schedule.problem)
    for own in schedule.by_device():
        seq = [op.key for op in sorted(own, key=lambda o: o.start) if op.stream is Stream.COMPUTE]
        if in_w_order(seq, alike) != seq:
            return False
    return True


@pytest.mark.parametrize("rule", ["v-half", "v-min", "zb-v"])
def test_the_reassignment_keeps_a_schedule_valid_and_as_fast(rule: str) -> None:
    problem = exact_family(4, 8, 4.0)
    schedule = baseline(rule, problem)
    order = order_of(schedule)
    streams = {
        key: in_w_order(keys, w_class(problem)) if key[1] is Stream.COMPUTE else keys
        for key, keys in order.streams.items()
    }
    moved = simulate(Order(problem=problem, streams=streams, fractions=order.fractions,
                           waits=order.waits, variant=order.variant))  # fmt: skip
    assert streams != order.streams  # the rule interleaves the two stages' W otherwise
    assert validate(moved) == []
    assert _w_order_kept(moved)
    assert moved.objective_value("makespan") == pytest.approx(schedule.objective_value("makespan"))
    assert max(moved.metrics.peak_memory) <= max(schedule.metrics.peak_memory) + 1e-9


@pytest.mark.parametrize(
    "p,m,cap,placement",
    [(2, 4, 1.5, "v"), (3, 4, 2.0, "v"), (2, 5, 1.2, "loop"), (3, 4, 2.5, "v")],
)
def test_the_symmetry_loses_no_optimum(p: int, m: int, cap: float, placement: str) -> None:
    problem = exact_family(p, m, cap, placement)
    found = {}
    for memory_model in ("sequence", "cumulative"):
        options = SolveOptions(time_limit=30.0, threads=2, memory_model=memory_model)
        result = solve_cpsat(problem, dag_for(problem), options)
        assert result.status == "optimal", memory_model
        found[memory_model] = result.objective
    assert found["sequence"] == pytest.approx(found["cumulative"], abs=1e-6)


def test_solved_schedules_keep_the_order() -> None:
    result = solve(exact_family(3, 6, 2.5), time_limit=10, threads=2, seed=0)
    assert _w_order_kept(result.schedule)
