"""The fluid bound (pp_opt.solvers.fluid): never above a proved optimum, above the closed
forms where memory binds, and part of a solve where it applies."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from families import exact_family

from pp_opt.bounds import lower_bound
from pp_opt.problem import Problem, uniform_problem
from pp_opt.problem_io import load_problem, resplit
from pp_opt.solvers import solve
from pp_opt.solvers.fluid import applies, fluid_bound
from pp_opt.validator import validate

ROOT = Path(__file__).resolve().parent.parent


# Proved optima (bench_solvers.py --parts exact, status optimal, gap 0).
PROVED = {(3, 6, 2.5): 18.0, (3, 6, 2.0): 19.3, (4, 8, 3.0): 25.2, (3, 8, 2.5): 23.2,
          (3, 8, 2.0): 24.5, (4, 8, 2.5): 27.1, (3, 6, 3.0): 16.9, (4, 8, 4.0): 22.75}  # fmt: skip


@pytest.mark.parametrize(("p", "m", "cap"), list(PROVED))
def test_never_above_a_proved_optimum(p: int, m: int, cap: float) -> None:
    optimum = PROVED[(p, m, cap)]
    for buckets in (60, 150):
        found = fluid_bound(exact_family(p, m, cap), lower=0.0, upper=1.5 * optimum,
                            deadline=time.perf_counter() + 20, buckets=buckets)  # fmt: skip
        assert found is not None
        assert found.value <= optimum + 1e-9


@pytest.mark.parametrize(
    "problem",
    [
        uniform_problem(p=2, m=5, t_f=1.0, t_b=1.0, t_w=3.0, m_w=0.1, cap=1.3),
        uniform_problem(p=3, m=5, t_f=1.0, t_b=0.5, t_w=2.0, m_w=0.2, cap=2.2, t_comm=0.5),
        uniform_problem(
            p=2, m=6, t_f=0.5, t_b=1.0, t_w=0.0, m_w=0.0, cap=1.15, t_comm=1.0, placement="v", v=2
        ),  # fmt: skip
        uniform_problem(
            p=3, m=4, t_f=1.0, t_b=1.0, t_w=0.5, m_w=0.2, cap=1.5, t_comm=0.5, split_backward=False
        ),  # fmt: skip
    ],
    ids=["deferred-w", "latency", "v-zero-w", "fused"],
)
def test_never_above_an_optimum_cpsat_proves_alone(
    problem: Problem, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Proved by CP-SAT without any outside bound, or by the closed forms (too few ops for
    # the fluid to run).
    monkeypatch.setenv("PP_OPT_IN_PROCESS", "1")
    monkeypatch.setattr("pp_opt.solvers.cpsat.objective.lower_bound", lambda *a, **k: 0.0)
    problem = problem.replace(objective="makespan")
    result = solve(problem, time_limit=20, seed=0)
    assert result.status == "optimal"
    found = fluid_bound(problem, lower=0.0, upper=1.5 * result.objective,
                        deadline=time.perf_counter() + 20)  # fmt: skip
    assert found is not None
    assert found.value <= result.objective + 1e-9


@pytest.mark.timing
def test_raises_the_bound_of_a_tight_v_row() -> None:
    """bench_solvers.py --parts tight, 1.5B V-Min (cap 4): the device at the turn of the V
    (device 7) holds its warm-up, steady state and cool-down together: 1302.37 -> 1366-1368
    (1499.30 is the best schedule known)."""
    base = load_problem(ROOT / "examples" / "zb-1.5b.toml")
    problem = resplit(base, "v", 2).replace(objective="makespan")
    problem = problem.replace(devices=tuple(replace(d, cap=4.0) for d in problem.devices))
    assert applies(problem, "makespan")
    closed = lower_bound(problem)
    assert closed == pytest.approx(1302.37, abs=0.01)
    found = fluid_bound(problem, lower=closed, upper=1499.30, deadline=time.perf_counter() + 6)
    assert found is not None
    assert found.device == 7
    assert 1360.0 <= found.value <= 1499.30


def test_where_it_applies() -> None:
    big = exact_family(4, 30, 3.0)  # 180 compute ops per device
    assert applies(big, "makespan")
    assert not applies(big, "span")
    assert not applies(big.replace(offload=True), "makespan")
    assert not applies(exact_family(4, 8, 3.0), "makespan")  # 48 ops: CP-SAT's device relaxation


def test_a_solve_reports_it_and_stays_valid() -> None:
    problem = exact_family(4, 30, 2.5)
    result = solve(problem, time_limit=6, seed=0)
    schedule = result.schedule
    assert validate(schedule) == []
    fluid = schedule.solver.extra["fluid_bound"]
    assert fluid["value"] > lower_bound(problem)
    assert schedule.solver.lower_bound >= fluid["value"] - 1e-9
    assert schedule.solver.lower_bound <= result.objective + 1e-9


def test_leaves_highs_usable_with_other_thread_counts() -> None:
    # HiGHS sizes one thread pool per process on first use; the fluid bound (one thread)
    # resets it, so the MILP backend's HiGHS (two threads) still solves in that process.
    from pp_opt.dag import dag_for
    from pp_opt.solvers.base import SolveOptions
    from pp_opt.solvers.milp import solve_milp

    fluid_bound(exact_family(3, 6, 2.5), lower=0.0, upper=27.0, deadline=time.perf_counter() + 2)
    problem = uniform_problem(p=2, m=3).replace(objective="makespan")
    options = SolveOptions(time_limit=10, objective="makespan", threads=2)
    result = solve_milp(problem, dag_for(problem), options, backend="highs")
    assert result.objective == pytest.approx(10.0)
