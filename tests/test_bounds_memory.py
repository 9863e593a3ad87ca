"""Memory-aware lower bounds (issue 10): closed forms, and never above a proved optimum."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pp_opt.bounds import (
    lower_bound,
    memory_area,
    memory_envelope,
    memory_makespan,
    turn_makespan,
)
from pp_opt.problem import Problem, uniform_problem
from pp_opt.problem_io import load_problem, resplit
from pp_opt.solvers import solve


def _tight() -> Problem:
    """Two devices, four microbatches, unit costs, room for one activation per device."""
    return uniform_problem(p=2, m=4, t_f=1.0, t_b=1.0, t_w=1.0, m_b=1.0, m_w=0.0, cap=1.0)


def test_warm_up_and_cool_down_idle_closed_form() -> None:
    # Device 0: one activation at a time (K = 1); its backward comes A = 1 + 2 after its
    # forward; a microbatch's other work there is w1 = 1, so it idles 2 before the first
    # backward: 0 + 2 + (4 F + 4 B) + max(4 W, 0) = 14. Cool-down: W holds no memory here,
    # so all three other W may wait for the end: work left 1 + 3 + 2, and 0 + 2 + (12 - 6)
    # + 3 + 1 + 1 = 13.
    assert memory_makespan(_tight()) == pytest.approx(14.0)
    # With W holding memory (m_w = 0.5 of a room of 1), at most one W waits: work left
    # 1 + 2 + 0 (the room goes to the microbatch in flight first: 2 per unit against 2)
    # gives 0 + 2 + 9 + 3 + 1 + 1 = 16.
    held = _tight().replace(stages=tuple(replace(st, m_w=0.5) for st in _tight().stages))
    assert memory_makespan(held) == pytest.approx(16.0)


def test_turn_idle_closed_form() -> None:
    # Device 0 holds one activation (K = 1): its first backward starts at 3, one forward
    # fits before it: idle 2. After its last forward the microbatch needs 1 + 1 + 1 + 1 + 1
    # = 5 more (F, F and B on device 1, B and W here); the work left is that microbatch's
    # 3, plus every W (m_w = 0 holds nothing): 7 >= 5, no idle. 2 + 12 = 14.
    assert turn_makespan(_tight()) == pytest.approx(14.0)
    # With m_w = 0.5 no W fits beside the last forward's activation: 3 left, idle 2 more.
    held = _tight().replace(stages=tuple(replace(st, m_w=0.5) for st in _tight().stages))
    assert turn_makespan(held) == pytest.approx(16.0)
    # No memory binds: never above the device bound.
    roomy = uniform_problem(p=4, m=8, t_comm=0.05)
    assert turn_makespan(roomy) <= lower_bound(roomy) + 1e-9


def test_turn_bound_meets_proved_v_optima() -> None:
    """bench_solvers.py --parts exact: at ZB-V's cap the turn bound is the optimum itself
    (16.90, 22.75), and below every other proved optimum of the table."""
    proved = {(3, 6, 2.5): 18.0, (3, 6, 2.0): 19.3, (4, 8, 3.0): 25.2,
              (3, 8, 2.5): 23.2, (3, 8, 2.0): 24.5, (4, 8, 2.5): 27.1,
              (3, 6, 3.0): 16.9, (4, 8, 4.0): 22.75}  # fmt: skip
    for (p, m, cap), optimum in proved.items():
        problem = uniform_problem(p=p, m=m, t_f=1.0, t_b=1.0, t_w=0.6, m_b=1.0, m_w=0.4,
                                  t_comm=0.05, cap=cap, placement="v", v=2)  # fmt: skip
        assert turn_makespan(problem) <= optimum + 1e-9
    v3 = uniform_problem(p=3, m=6, t_f=1.0, t_b=1.0, t_w=0.6, m_b=1.0, m_w=0.4, t_comm=0.05,
                         cap=3.0, placement="v", v=2)  # fmt: skip
    assert turn_makespan(v3) == pytest.approx(16.9)


def test_littles_law_closed_form() -> None:
    # Device 0 holds each activation for at least 1 + 2 + 1: 4 microbatches need an area of
    # 16 under a room of 1.
    assert memory_area(_tight()) == pytest.approx(16.0)


def test_memory_envelope_closed_form() -> None:
    # One device, m = 4, unit F and B, no W: each activation holds m_b = 1 for F + B = 2,
    # area 8 in a room of 2. Filling: 1 by t = 0, 2 from t = 1. Emptying: one B ends in
    # (t, T] per unit of time, plus the one running at t: mem(t) <= 1 + (T - t). The
    # envelope min(2, h, e) is 1 on [0, 1), 2 on [1, T - 1), then 1 + (T - t): its
    # integral 1 + 2 (T - 2) + 1.5 = 8 at T = 4.75. Little's law alone gives 4.
    problem = uniform_problem(p=1, m=4, t_f=1.0, t_b=1.0, t_w=0.0, m_b=1.0, m_w=0.0, cap=2.0,
                              split_backward=False)  # fmt: skip
    assert memory_area(problem) == pytest.approx(4.0)
    assert memory_envelope(problem) == pytest.approx(4.75, rel=1e-9)
    # The device does 8 of work, so the bound is below the load here; a schedule meets 8.
    assert lower_bound(problem) == pytest.approx(8.0)
    # With offload the copies change the ceilings: the term steps aside.
    assert memory_envelope(problem.replace(offload=True)) == 0.0


def test_memory_envelope_past_its_steps_is_a_weaker_ceiling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Past ENVELOPE_STEPS the staircase gives way to the line through its corners: a
    # ceiling above it, so the bound can only drop, and only a little.
    problem = uniform_problem(p=4, m=16, t_f=1.0, t_b=1.0, t_w=0.5, m_b=1.0, m_w=0.3,
                              t_comm=0.5, cap=12.0)  # fmt: skip
    exact = memory_envelope(problem)
    monkeypatch.setattr("pp_opt.bounds.memory.ENVELOPE_STEPS", 2)
    lined = memory_envelope(problem)
    assert exact - 1.0 <= lined <= exact + 1e-9
    assert lined < exact


def test_memory_envelope_raises_the_tight_v_rows() -> None:
    """bench_solvers.py --parts tight: on 28.3B V-Min (cap 12) the envelope is the bound,
    above the turn bound (3160.73) and Little's law alone."""
    base = load_problem(Path(__file__).resolve().parent.parent / "examples" / "zb-28.3b.toml")
    problem = resplit(base, "v", 2).replace(objective="makespan")
    problem = problem.replace(devices=tuple(replace(d, cap=12.0) for d in problem.devices))
    assert memory_envelope(problem) == pytest.approx(3229.30, abs=0.01)
    assert lower_bound(problem) == pytest.approx(3229.30, abs=0.01)
    assert turn_makespan(problem) < 3229.30 - 50
    assert memory_area(problem) < 3229.30 - 50


def test_offload_bandwidth_closed_form() -> None:
    # Offloading an activation of stage 0 saves at most m_b * round_trip = 2 of area and
    # takes 5 of copy time: (16 - T) / 2 offloads, so T >= 2.5 (16 - T), T >= 40 / 3.5.
    problem = _tight().replace(
        offload=True,
        stages=tuple(replace(st, t_offload=5.0, t_reload=5.0) for st in _tight().stages),
    )
    assert memory_area(problem) == pytest.approx(40 / 3.5, rel=1e-6)
    assert memory_makespan(problem) < 16.0  # a fully offloaded activation keeps nothing


def test_memory_terms_raise_the_bound_only_when_the_cap_binds() -> None:
    roomy = uniform_problem(p=4, m=8, t_comm=0.05)
    assert memory_makespan(roomy) <= lower_bound(roomy.replace(), "makespan") + 1e-9
    tight = _tight()
    loose = tight.replace(devices=tuple(replace(d, cap=8.0) for d in tight.devices))
    assert lower_bound(tight) > lower_bound(loose)


@pytest.mark.parametrize(
    "problem",
    [
        _tight(),
        uniform_problem(p=2, m=3, t_f=1.0, t_b=2.0, t_w=1.0, m_w=0.5, cap=1.5),
        uniform_problem(p=2, m=4, placement="v", v=2, t_w=0.5, m_w=0.25, cap=1.0),
        uniform_problem(p=3, m=3, t_f=1.0, t_b=1.0, t_w=0.5, m_w=0.5, cap=2.0, t_comm=0.1),
        # W worth far more than its memory: a schedule defers W to the cool-down.
        uniform_problem(p=2, m=5, t_f=1.0, t_b=1.0, t_w=3.0, m_w=0.1, cap=1.3),
        uniform_problem(p=3, m=5, t_f=1.0, t_b=0.5, t_w=2.0, m_w=0.2, cap=2.2),
        uniform_problem(
            p=3,
            m=2,
            t_f=0.5,
            t_b=1.0,
            t_w=1.0,
            m_w=0.2,
            cap=2.0,
            placement="v",
            v=2,
            split_backward=False,
        ),  # fmt: skip
        uniform_problem(
            p=3, m=4, t_f=1.0, t_b=1.0, t_w=0.6, m_w=0.4, t_comm=0.05, cap=2.0, placement="v", v=2
        ),  # fmt: skip
    ],
    ids=["unit", "uneven", "v", "three", "deferred-w", "deferred-w-3", "v-fused", "v-tight"],
)
def test_bound_never_above_a_proved_optimum(
    problem: Problem, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CP-SAT proves the optimum on its own: the bound under test must not help it.
    monkeypatch.setenv("PP_OPT_IN_PROCESS", "1")  # the patch must reach the backend
    monkeypatch.setattr("pp_opt.solvers.cpsat.objective.lower_bound", lambda *a, **k: 0.0)
    result = solve(problem, time_limit=20, seed=0)
    assert result.schedule.solver.extra["backend_status"] == "optimal"
    assert lower_bound(problem) <= result.objective + 1e-9
    assert memory_makespan(problem) <= result.objective + 1e-9
    assert memory_area(problem) <= result.objective + 1e-9
    assert turn_makespan(problem) <= result.objective + 1e-9
    assert memory_envelope(problem) <= result.objective + 1e-9


def test_optimal_only_at_zero_gap() -> None:
    """Costs without a short decimal form make CP-SAT solve a rounded model; its proof does
    not carry over, so the result is optimal only if the independent bound meets it."""
    problem = uniform_problem(p=2, m=3, t_f=1 / 3, t_b=2 / 7, t_w=1 / 9, cap=4.0)
    result = solve(problem, time_limit=10, seed=0)
    if result.status == "optimal":
        assert result.gap == 0.0
        assert result.lower_bound == pytest.approx(result.objective)
    else:
        assert result.gap > 0.0
