"""The pinned copies (:mod:`pp_opt.solvers.cpsat.pinned`): window by window, a fixed compute
order gets copies that keep it near its uncapped timing, and the result is a valid schedule.

Small windows (5 microbatches first, 2 more each time, 5 left free) on a small ``v``
problem with a shared host link make the rolling part run in a few seconds.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from pp_opt.ops import OpKind
from pp_opt.orders import baseline
from pp_opt.orders.offload.offload_links import with_link_offloads
from pp_opt.orders.offload.offload_warm import raised
from pp_opt.problem import Problem, uniform_problem
from pp_opt.solvers import solve
from pp_opt.solvers.base import SolveOptions, pins_copies
from pp_opt.solvers.cpsat import pinned
from pp_opt.solvers.cpsat.fixed_order import as_schedule, compute_orders, order_makespan
from pp_opt.validator import validate


def _v_offload(m: int, cap: float = 2.0) -> Problem:
    problem = uniform_problem(p=3, m=m, t_f=1.0, t_b=1.0, t_w=0.6, m_b=1.0, m_w=0.4,
                              t_comm=0.05, cap=cap, placement="v", v=2,
                              host_links=((0, 1),))  # fmt: skip
    stages = tuple(dataclasses.replace(st, t_offload=0.8, t_reload=0.8) for st in problem.stages)
    return problem.replace(stages=stages, offload=True, objective="makespan")


@pytest.fixture
def small_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pinned, "FIRST_MICROBATCHES", 5)
    monkeypatch.setattr(pinned, "STEP_MICROBATCHES", 2)
    monkeypatch.setattr(pinned, "FREE_MICROBATCHES", 5)


def test_pinned_copies_keep_the_order_within_its_pins_and_are_valid(small_windows: None) -> None:
    problem = _v_offload(9)  # windows of 5, 7 and 9 microbatches
    source = baseline("v-half", raised(problem)[-1])  # an order made for 1.5 times the room
    greedy = with_link_offloads(problem, source)
    assert greedy is not None and not validate(greedy)
    options = SolveOptions(time_limit=8.0, threads=2)
    ops = pinned.pinned_copies(problem, greedy, options, until=time.perf_counter() + 8.0)
    assert ops is not None
    schedule = as_schedule(problem, ops, greedy.variant)
    assert not validate(schedule)
    assert compute_orders(schedule) == compute_orders(greedy)
    assert any(op.kind is OpKind.OFFLOAD for op in schedule.ops)
    # No compute op later than its pin; copies never beat the uncapped order.
    orders = compute_orders(greedy)
    pins = pinned._pins(problem, pinned._uncapped(problem, greedy, orders))
    for op in schedule.ops:
        if op.key in pins:
            assert op.start <= pins[op.key] + 1e-9
    assert schedule.metrics.makespan >= order_makespan(problem, greedy) - 1e-9


def test_pinned_copies_give_up_without_time(small_windows: None) -> None:
    problem = _v_offload(6)
    greedy = with_link_offloads(problem, baseline("v-half", raised(problem)[-1]))
    assert greedy is not None
    options = SolveOptions(time_limit=1.0, threads=1)
    assert pinned.pinned_copies(problem, greedy, options, until=time.perf_counter()) is None


def test_which_solves_pin_copies() -> None:
    assert pins_copies(_v_offload(12))
    assert not pins_copies(_v_offload(11))  # small: the whole fixed-order model does it
    assert not pins_copies(_v_offload(12).replace(offload=False))
    loop = uniform_problem(p=3, m=12, cap=2.0).replace(offload=True)
    assert not pins_copies(loop)  # ``loop`` without links: the greedy copies do well


def test_a_pinned_solve_is_valid_and_never_loses_to_its_warm_start() -> None:
    problem = _v_offload(12)
    result = solve(problem, time_limit=5.0)
    assert not validate(result.schedule)
    assert result.warm_start is not None
    assert result.objective <= result.warm_start.objective + 1e-9


def test_a_fused_order_on_a_split_problem_is_not_pinned() -> None:
    """A fused backward cheaper than its parts makes the fastest order a ``BW`` one; the
    windows model the problem's split DAG, so they take the fastest split order or none
    (the plan of ``make demo`` failed with ``KeyError: OpKey(BW, ...)`` in a window)."""
    problem = uniform_problem(p=4, m=12, t_f=1.0, t_b=1.0, t_w=1.0, m_b=1.0, m_w=0.5,
                              t_comm=0.05, cap=3.0, host_links=((0, 1), (2, 3)))  # fmt: skip
    stages = tuple(
        dataclasses.replace(s, t_bw=1.2, t_offload=0.5, t_reload=0.5) for s in problem.stages
    )
    problem = problem.replace(stages=stages, offload=True)
    result = solve(problem, time_limit=4.0, threads=2)
    assert validate(result.schedule) == []
    assert result.objective <= result.schedule.metrics.makespan + 1e-9
