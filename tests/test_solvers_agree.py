"""CP-SAT and the MILP (CBC, HiGHS) prove the same optima; MILP results are valid and
never worse than their warm start.

Instances are small enough (p <= 3, m <= 4) that every solver proves optimality in
about a second; each one has a memory cap that binds (checked below).
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from pp_opt.dag import dag_for
from pp_opt.metrics import compute_metrics
from pp_opt.order import Variant
from pp_opt.orders import best_baseline
from pp_opt.problem import Device, Problem, Stage, uniform_problem
from pp_opt.schedule import Schedule, SolverInfo, Status
from pp_opt.solvers import solve
from pp_opt.solvers.base import SolveOptions
from pp_opt.solvers.milp import solve_milp
from pp_opt.validator import check_schedule

LIMIT = 20.0
"""Seconds per solve; every instance here is proved optimal far sooner."""


def _with_offload(problem: Problem, t_offload: float, t_reload: float) -> Problem:
    stages = tuple(
        dataclasses.replace(st, t_offload=t_offload, t_reload=t_reload) for st in problem.stages
    )
    return problem.replace(stages=stages, offload=True)


def _loop_p2() -> Problem:
    return uniform_problem(p=2, m=3, t_f=1.0, t_b=1.2, t_w=0.6, m_w=0.3, t_comm=0.1, cap=1.5)


def _loop_p3() -> Problem:
    return uniform_problem(p=3, m=3, t_f=1.0, t_b=1.0, t_w=0.5, m_w=0.4, t_comm=0.1, cap=2.0)


def _v_p2() -> Problem:
    return uniform_problem(p=2, m=2, t_f=1.0, t_b=1.0, t_w=1.0, m_w=0.5, placement="v", v=2,
                           cap=1.0)  # fmt: skip


def _offload_p2() -> Problem:
    base = uniform_problem(p=2, m=2, t_f=1.0, t_b=1.0, t_w=0.5, m_w=0.3, t_comm=0.1, cap=1.0)
    return _with_offload(base, 0.5, 0.5)


def _recompute_p2() -> Problem:
    base = uniform_problem(p=2, m=2, t_f=1.0, t_b=1.0, t_w=0.5, m_w=0.3, t_comm=0.1, cap=1.0)
    stages = tuple(dataclasses.replace(st, m_in=0.2) for st in base.stages)
    return base.replace(stages=stages, recompute=True)


def _uneven_p2() -> Problem:
    """Stage 1 forwards slowly: the span optimum (12.0) beats the makespan optimum (13.1)."""
    stages = (
        Stage(device=0, t_f=1.0, t_b=1.0, t_w=0.5, m_w=0.3),
        Stage(device=1, t_f=2.0, t_b=1.0, t_w=1.0, m_w=0.3),
    )
    devices = tuple(Device(cap=3.0) for _ in range(2))
    return Problem(p=2, m=3, stages=stages, devices=devices, t_comm=0.1)


def _fused_p3() -> Problem:
    return uniform_problem(p=3, m=4, t_f=1.0, t_b=1.2, t_w=0.6, m_w=0.3, t_comm=0.1, cap=2.0,
                           split_backward=False)  # fmt: skip


def _shared_link_p2() -> Problem:
    return _offload_p2().replace(host_links=((0, 1),))


CASES = [
    pytest.param(_loop_p2, "makespan", (1.0,), 14.4, id="loop-p2-makespan"),
    pytest.param(_loop_p2, "span", (1.0,), 14.4, id="loop-p2-span"),
    pytest.param(_loop_p3, "makespan", (1.0,), 13.8, id="loop-p3-makespan"),
    pytest.param(_v_p2, "makespan", (1.0,), 8.5, id="v-p2-makespan"),
    pytest.param(_uneven_p2, "makespan", (1.0,), 13.1, id="uneven-p2-makespan"),
    pytest.param(_uneven_p2, "span", (1.0,), 12.0, id="uneven-p2-span"),
    pytest.param(_fused_p3, "makespan", (1.0,), 20.4, id="fused-p3-makespan"),
    pytest.param(_offload_p2, "makespan", (1.0,), 7.2, id="offload-p2-makespan"),
    pytest.param(_offload_p2, "span", (1.0,), 7.2, id="offload-p2-span"),
    pytest.param(_offload_p2, "makespan", (0.5, 1.0), 7.2, id="offload-fractions-p2"),
    pytest.param(_shared_link_p2, "makespan", (1.0,), 7.2, id="shared-link-p2"),
    pytest.param(_recompute_p2, "makespan", (1.0,), 8.9, id="recompute-p2-makespan"),
    pytest.param(_recompute_p2, "span", (1.0,), 8.9, id="recompute-p2-span"),
]


def _milp(problem: Problem, objective: str, **kwargs: object) -> tuple[float, str]:
    options = SolveOptions(time_limit=LIMIT, objective=objective)
    result = solve_milp(problem, dag_for(problem), options, **kwargs)  # type: ignore[arg-type]
    assert result.objective is not None
    return result.objective, result.status


def _schedule(problem: Problem, ops: tuple) -> Schedule:
    info = SolverInfo(name="milp", status=Status.FEASIBLE, objective=0.0)
    return Schedule(problem=problem, ops=ops, solver=info, metrics=compute_metrics(problem, ops),
                    variant=Variant.of_problem(problem))  # fmt: skip


@pytest.mark.parametrize(("make", "objective", "fractions", "optimum"), CASES)
def test_cpsat_and_milp_prove_the_same_optimum(make, objective, fractions, optimum) -> None:
    problem = make()
    kwargs = dict(objective=objective, time_limit=LIMIT, offload_fractions=fractions)
    cpsat = solve(problem, solver="cpsat", **kwargs)
    milp = solve(problem, solver="milp", **kwargs)
    assert cpsat.status == milp.status == "optimal"
    assert milp.objective == pytest.approx(cpsat.objective, abs=1e-6)
    assert milp.objective == pytest.approx(optimum, abs=1e-6)
    assert milp.lower_bound == pytest.approx(milp.objective, abs=1e-6)
    assert max(milp.schedule.metrics.peak_memory) <= problem.devices[0].cap + 1e-9


@pytest.mark.parametrize(
    ("make", "loose_cap", "loose_optimum"),
    [(_loop_p2, 4.0, 9.6), (_loop_p3, 6.0, 10.9), (_v_p2, 4.0, 6.5)],
    ids=["loop-p2", "loop-p3", "v-p2"],
)
def test_the_caps_bind(make, loose_cap, loose_optimum) -> None:
    """Each agreement instance is harder than its loose-cap version (so memory is tested)."""
    problem = make()
    devices = tuple(dataclasses.replace(d, cap=loose_cap) for d in problem.devices)
    loose, status = _milp(problem.replace(devices=devices), "makespan")
    assert status == "optimal"
    assert loose == pytest.approx(loose_optimum, abs=1e-6)
    assert loose < _milp(problem, "makespan")[0] - 0.5


@pytest.mark.parametrize(
    ("make", "switch"), [(_offload_p2, "offload"), (_recompute_p2, "recompute")]
)
def test_offload_and_recompute_pay_at_their_cap(make, switch: str) -> None:
    problem = make()
    with_choice, _ = _milp(problem, "makespan")
    without, status = _milp(problem.replace(**{switch: False}), "makespan")
    assert status == "optimal"
    assert with_choice < without - 0.4


@pytest.mark.parametrize("make", [_loop_p2, _offload_p2], ids=["loop-p2", "offload-p2"])
def test_highs_agrees_with_cbc(make) -> None:
    problem = make()
    cbc, cbc_status = _milp(problem, "makespan")
    highs, highs_status = _milp(problem, "makespan", backend="highs")
    assert cbc_status == highs_status == "optimal"
    assert highs == pytest.approx(cbc, abs=1e-6)


@pytest.mark.parametrize("make", [_loop_p2, _v_p2], ids=["loop-p2", "v-p2"])
def test_symmetry_breaking_keeps_the_optimum(make) -> None:
    problem = make()
    assert _milp(problem, "makespan", symmetry=False)[0] == pytest.approx(
        _milp(problem, "makespan")[0], abs=1e-6
    )


@pytest.mark.parametrize("limit", [0.01, 3.0])
def test_milp_is_valid_and_never_worse_than_its_warm_start(limit: float) -> None:
    problem = uniform_problem(p=4, m=8, t_f=1.0, t_b=1.1, t_w=0.7, m_w=0.3, t_comm=0.1, cap=4.0)
    warm = best_baseline(problem)
    assert warm is not None
    options = SolveOptions(time_limit=limit, objective="makespan", warm_start=warm)
    result = solve_milp(problem, dag_for(problem), options)
    assert result.ops is not None and result.objective is not None
    assert result.status in ("optimal", "feasible")
    assert result.objective <= warm.metrics.makespan + 1e-9
    schedule = check_schedule(_schedule(problem, result.ops))
    assert schedule.metrics.makespan == pytest.approx(result.objective, abs=1e-9)
    if result.bound is not None:
        assert result.bound <= result.objective + 1e-9


@pytest.mark.parametrize("backend", ["cbc", "highs"])
def test_milp_same_seed_same_schedule(backend: str) -> None:
    problem = _offload_p2()
    options = SolveOptions(time_limit=LIMIT, objective="makespan", seed=3)
    first = solve_milp(problem, dag_for(problem), options, backend=backend)
    second = solve_milp(problem, dag_for(problem), options, backend=backend)
    assert first.ops == second.ops


def test_milp_reports_an_infeasible_cap() -> None:
    problem = _loop_p2()
    devices = tuple(dataclasses.replace(d, cap=0.9) for d in problem.devices)
    options = SolveOptions(time_limit=LIMIT, objective="makespan")
    tight = problem.replace(devices=devices)
    result = solve_milp(tight, dag_for(tight), options)
    assert result.status == "infeasible"
    assert result.ops is None


@pytest.mark.parametrize("backend", ["cbc", "highs"])
def test_milp_reports_progress(backend: str) -> None:
    problem = _loop_p2()
    seen: list = []
    options = SolveOptions(time_limit=LIMIT, objective="makespan", progress=seen.append)
    result = solve_milp(problem, dag_for(problem), options, backend=backend)
    assert len(seen) >= 2
    assert seen[0].objective is None  # no warm start: nothing known at the start
    assert seen[-1].objective == pytest.approx(result.objective)
    assert seen[-1].bound == pytest.approx(result.objective)
    assert all(a.seconds <= b.seconds for a, b in zip(seen, seen[1:], strict=False))


def _random_problem(seed: int) -> Problem:
    """Small loop problems with uneven stages and a cap that 1F1B fits (a warm start exists)."""
    rng = random.Random(seed)
    p, m = rng.choice([(2, 4), (3, 4), (3, 6)])
    stages = tuple(
        Stage(device=s, t_f=rng.choice([0.8, 1.0, 1.3]), t_b=rng.choice([1.0, 1.2, 1.6]),
              t_w=rng.choice([0.4, 0.6, 0.9]), m_b=1.0, m_w=rng.choice([0.2, 0.4]))
        for s in range(p)
    )  # fmt: skip
    cap = p + rng.choice([0.0, 0.5, 1.0])
    devices = tuple(Device(cap=cap) for _ in range(p))
    return Problem(p=p, m=m, stages=stages, devices=devices, t_comm=rng.choice([0.0, 0.1]))


@pytest.mark.parametrize("backend", ["cbc", "highs"])
@pytest.mark.parametrize("seed", range(3))
def test_warm_start_guarantee_on_random_instances(seed: int, backend: str) -> None:
    problem = _random_problem(seed)
    warm = best_baseline(problem)
    assert warm is not None
    options = SolveOptions(time_limit=1.0, objective="makespan", warm_start=warm, seed=seed)
    result = solve_milp(problem, dag_for(problem), options, backend=backend)
    assert result.ops is not None and result.objective is not None
    assert result.objective <= warm.metrics.makespan + 1e-9
    check_schedule(_schedule(problem, result.ops))


def test_milp_in_bytes_matches_milp_in_activations() -> None:
    """Byte-sized memory (and static memory) gives the same optimum as multiples of m_b."""
    gib = 2.0**30
    base = _loop_p2()
    stages = tuple(
        dataclasses.replace(st, m_b=st.m_b * gib, m_w=st.m_w * gib) for st in base.stages
    )
    devices = tuple(Device(cap=(d.cap + 3.0) * gib, static=3.0 * gib) for d in base.devices)
    in_bytes = base.replace(stages=stages, devices=devices, unit="bytes")
    options = SolveOptions(time_limit=LIMIT, objective="makespan")
    result = solve_milp(in_bytes, dag_for(in_bytes), options)
    assert result.status == "optimal" and result.ops is not None
    assert result.objective == pytest.approx(_milp(base, "makespan")[0], abs=1e-6)
    check_schedule(_schedule(in_bytes, result.ops))


def test_milp_highs_is_a_solver_name() -> None:
    """``solve(solver="milp-highs")`` runs the MILP through HiGHS and agrees with CP-SAT."""
    problem = uniform_problem(p=2, m=3, t_comm=0.1, m_w=0.5, cap=2.0)
    highs = solve(problem, solver="milp-highs", time_limit=10, warm_start=False)
    cpsat = solve(problem, solver="cpsat", time_limit=10, warm_start=False)
    assert highs.status == cpsat.status == "optimal"
    assert highs.objective == pytest.approx(cpsat.objective)
