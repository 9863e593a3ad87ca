"""The lower bound: closed forms, and never above any schedule (classic or solved)."""

from __future__ import annotations

import pytest

from pp_opt.bounds import lower_bound
from pp_opt.errors import PPOptError
from pp_opt.orders import baseline, baseline_names
from pp_opt.problem import uniform_problem
from pp_opt.solvers import solve


def test_one_device_bound_is_the_load():
    problem = uniform_problem(p=1, m=5, t_f=1.0, t_b=2.0, t_w=0.5)
    assert lower_bound(problem, "makespan") == pytest.approx(5 * 3.5)
    assert lower_bound(problem, "span") == pytest.approx(5 * 3.5)


def test_makespan_bound_closed_form_loop():
    # Last device: fill 3 * t_f, its load 8 * (1 + 1), then max(W load 8, drain 3 + 1).
    problem = uniform_problem(p=4, m=8)
    assert lower_bound(problem, "makespan") == pytest.approx(3 + 16 + 8)


def test_makespan_bound_counts_latency():
    problem = uniform_problem(p=4, m=8, t_comm=0.5)
    assert lower_bound(problem, "makespan") == pytest.approx(3 * 1.5 + 16 + 8)


def test_critical_path_dominates_with_one_microbatch():
    problem = uniform_problem(p=4, m=1, t_comm=0.25)
    # Forwards 4, backwards 4, W of stage 0, and 2 * 3 hops.
    assert lower_bound(problem, "makespan") == pytest.approx(4 + 4 + 1 + 6 * 0.25)


def test_span_bound_round_trip_with_one_microbatch():
    problem = uniform_problem(p=3, m=1)
    # Device 0 holds the first F and its W: t_f + (2 F + 2 B above) + t_b + t_w.
    assert lower_bound(problem, "span") == pytest.approx(1 + 4 + 2)


CASES = [
    dict(p=4, m=8, t_comm=0.05, m_w=0.5),
    dict(p=4, m=8, t_f=1.0, t_b=1.2, t_w=0.6, t_comm=0.2, m_w=0.3),
    dict(p=3, m=6, t_f=2.0, t_b=1.0, t_w=1.5, t_comm=0.0),
    dict(p=4, m=8, placement="v", v=2, t_comm=0.1, m_w=0.4),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("objective", ["makespan", "span"])
def test_bound_below_every_baseline(case, objective):
    problem = uniform_problem(**case, objective=objective)
    checked = 0
    for name in baseline_names():
        try:
            schedule = baseline(name, problem)
        except PPOptError:
            continue
        bound = lower_bound(schedule.problem, objective)
        assert bound <= schedule.objective_value(objective) + 1e-9, name
        checked += 1
    assert checked >= 3


@pytest.mark.parametrize("objective", ["makespan", "span"])
def test_bound_below_solver_optimum(objective):
    problem = uniform_problem(p=3, m=4, t_f=1.0, t_b=1.5, t_w=0.5, t_comm=0.1, objective=objective)
    result = solve(problem, time_limit=10, threads=1)
    assert result.status == "optimal"
    assert lower_bound(problem, objective) <= result.objective + 1e-9
