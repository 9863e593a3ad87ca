"""CP-SAT's integer units: the coarsest exact time unit, and no optimum lost to it."""

from __future__ import annotations

import pytest
from families import exact_family

import pp_opt.solvers.cpsat.scaling as scaling
from pp_opt.problem import uniform_problem
from pp_opt.solvers import solve
from pp_opt.solvers.cpsat.scaling import choose_scaling


def test_the_unit_is_the_largest_step_every_duration_takes() -> None:
    # t_comm 0.05, t_f = t_b 0.5, t_w 0.3 (fused 0.8): hundredths, then steps of 5 of them
    family = choose_scaling(exact_family(4, 12, 2.5))
    assert family.time == 20.0 and family.exact
    assert [family.t(x) for x in (0.05, 0.5, 0.3, 0.8)] == [1, 10, 6, 16]
    # the Zero Bubble paper's 1.5B costs share no step above a hundredth
    zb = uniform_problem(p=8, m=24, t_f=18.52, t_b=18.09, t_w=9.34, t_comm=0.6, m_w=0.366)
    assert choose_scaling(zb).time == 100.0
    # whole numbers that are all even: a unit of two
    even = uniform_problem(p=2, m=2, t_f=2.0, t_b=4.0, t_w=2.0)
    assert choose_scaling(even).time == 0.5
    # durations without a short decimal keep the fine rounding (not exact)
    odd = uniform_problem(p=2, m=2, t_f=1 / 3, t_b=1.0, t_w=0.5)
    assert not choose_scaling(odd).time_exact


@pytest.mark.parametrize(("p", "m", "cap", "optimum"), [(3, 6, 2.5, 18.0), (3, 8, 2.0, 24.5)])
def test_the_coarse_unit_proves_what_hundredths_prove(monkeypatch, p, m, cap, optimum) -> None:
    """Left-shifted schedules start at sums of durations, so the coarse unit keeps the optimum."""
    monkeypatch.setenv("PP_OPT_IN_PROCESS", "1")  # the patch must reach the backend
    problem = exact_family(p, m, cap)
    coarse = solve(problem, time_limit=30, threads=2, seed=0)
    monkeypatch.setattr(scaling, "_common_unit", lambda values, scale: 1)
    assert choose_scaling(problem).time == 100.0
    fine = solve(problem, time_limit=30, threads=2, seed=0)
    assert coarse.status == fine.status == "optimal"
    assert coarse.objective == pytest.approx(optimum) and fine.objective == pytest.approx(optimum)
