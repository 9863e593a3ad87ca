"""CP-SAT's integer units: the coarsest exact time unit, no optimum lost to it, and what a
model of rounded units proves of the problem."""

from __future__ import annotations

import pytest
from families import exact_family

import pp_opt.solvers.cpsat.scaling as scaling
from pp_opt.problem import Device, Problem, Stage, uniform_problem
from pp_opt.solvers import solve
from pp_opt.solvers.cpsat.scaling import choose_scaling, problem_bound, time_rounding


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
    # a profile's bytes: whole numbers, their largest common divisor the unit (exact)
    profiled = choose_scaling(_profiled())
    assert profiled.memory == 1 / 2048 and profiled.memory_exact
    assert not choose_scaling(_profiled(odd_memory=True)).memory_exact
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


# A plan candidate's problem as the profiler gives it (tiny model, p 2, loop v 2, layers 2,2,1,1):
# times without a short decimal scale, memory in bytes under a cap far above it.
PROFILED = (
    (0, 0.0361065907009713, 0.06156546416998, 0.010334709470768581, 19968000.0, 16777216.0, 4096.0),
    (1, 0.035793582939777274, 0.06156546416998, 0.010021701709574551, 19963904.0, 16777216.0,
     524288.0),
    (0, 0.017896791469888637, 0.03078273208499, 0.0050108508547872755, 9981952.0, 8388608.0,
     524288.0),
    (1, 0.02457519926725554, 0.0374611398823569, 0.0066811344730497, 15226880.0, 11010048.0,
     524288.0),
)  # fmt: skip


def _profiled(*, decimals: int | None = None, cap: float = 81604378624.0,
              odd_memory: bool = False) -> Problem:  # fmt: skip
    def t(x: float) -> float:
        return x if decimals is None else round(x, decimals)

    def mem(x: float) -> float:  # bytes of no exact scale
        return x * 1.1 + 0.37 if odd_memory else x

    stages = tuple(Stage(device=d, t_f=t(f), t_b=t(b), t_w=t(w), m_b=mem(mb), m_w=mem(mw),
                         m_in=mem(mi)) for d, f, b, w, mb, mw, mi in PROFILED)  # fmt: skip
    return Problem(p=2, m=3, placement="loop", t_comm=t(0.011165084444444445), stages=stages,
                   devices=(Device(cap=cap, static=104888320.0),) * 2)  # fmt: skip


def test_a_rounded_model_bounds_the_problem_within_its_rounding() -> None:
    """Rounded times make CP-SAT's optimum that of a nearby problem; every order lasts at most
    ``1 + e`` times as long there, so its bound over ``1 + e`` holds for the problem. The
    solve then stops at the model's proof (no search windows after it; before, it searched to
    its limit at a 1.3% gap) and HiGHS, on the exact times, proves the same schedule optimal."""
    problem = _profiled()
    units = choose_scaling(problem)
    assert not units.time_exact and units.memory_exact
    rounding = time_rounding(problem, units)
    assert 0 < rounding < 1e-3
    found = solve(problem, time_limit=20, threads=1, seed=0).schedule
    exact = solve(problem, solver="milp-highs", time_limit=20, threads=1, seed=0).schedule
    assert exact.solver.status == "optimal"
    assert found.metrics.makespan == pytest.approx(exact.metrics.makespan, rel=1e-9)
    assert found.solver.lower_bound <= exact.metrics.makespan
    assert 0 < found.solver.gap <= (1 + rounding) ** 2 - 1
    assert "search" not in found.solver.extra


def test_a_cap_that_never_binds_leaves_a_decimal_problem_proved() -> None:
    """Memory of no exact scale is rounded, but where every activation fits the cap the model's
    rounded memory rejects no order: with decimal times the model's optimum is the problem's."""
    problem = _profiled(decimals=3, odd_memory=True)
    units = choose_scaling(problem)
    assert units.time_exact and not units.memory_exact
    found = solve(problem, time_limit=20, threads=1, seed=0).schedule
    assert found.solver.status == "optimal" and found.solver.gap == 0.0
    assert found.metrics.makespan == pytest.approx(0.62)  # HiGHS proves the same optimum


def test_a_rounded_model_says_nothing_where_its_rounding_changes_the_problem() -> None:
    problem = _profiled()
    units = choose_scaling(problem)
    assert problem_bound(problem, units, "makespan", 1000.0, paired=False) is not None
    assert problem_bound(problem, units, "span", 1000.0, paired=False) is None
    assert problem_bound(problem, units, "makespan", 1000.0, paired=True) is None
    for switch in ("offload", "recompute"):
        changed = problem.replace(**{switch: True})
        assert problem_bound(changed, units, "makespan", 1000.0, paired=False) is None
    # activations of no exact scale under a cap that holds two of the three microbatches':
    # the model's memory, rounded up against a cap rounded down, may bind where it did not
    room = 2 * (1.1 * (19968000.0 + 9981952.0) + 2 * 0.37)
    tight = _profiled(cap=104888320.0 + room, odd_memory=True)
    units = choose_scaling(tight)
    assert not units.memory_exact
    assert problem_bound(tight, units, "makespan", 1000.0, paired=False) is None
