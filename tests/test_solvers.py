"""CP-SAT through ``solve``: optimal on closed forms, the warm-start guarantee, caps, offload,
recompute, infeasible caps with the right minimum, determinism."""

from __future__ import annotations

import random

import pytest

from pp_opt.bounds import min_feasible_cap
from pp_opt.dag import dag_for
from pp_opt.errors import InfeasibleError
from pp_opt.ops import OpKind
from pp_opt.problem import Device, Problem, Stage, uniform_problem
from pp_opt.simulator import retime
from pp_opt.solvers import solve
from pp_opt.solvers.base import SolveOptions
from pp_opt.solvers.cpsat import solve_cpsat
from pp_opt.validator import validate


def check(result, problem: Problem) -> None:
    """What every result must satisfy: valid, under its caps, re-timing keeps the objective."""
    schedule = result.schedule
    assert validate(schedule) == []
    for d, peak in enumerate(schedule.metrics.peak_memory):
        assert peak <= problem.devices[d].cap + 1e-9
    again = retime(schedule)
    assert again.objective_value(result.schedule.problem.objective) == pytest.approx(
        result.objective, abs=1e-9
    )
    assert result.lower_bound <= result.objective + 1e-9


def test_one_device_is_its_load():
    problem = uniform_problem(p=1, m=4, t_f=1.0, t_b=2.0, t_w=0.5, cap=1.0)
    result = solve(problem, time_limit=5, warm_start=False)
    assert result.status == "optimal"
    assert result.objective == pytest.approx(4 * 3.5)
    check(result, problem)


def test_a_fused_warm_start_proved_optimal_is_taken_as_it_is(caplog):
    """The backend hands back a fused warm start it proves optimal on a split problem (one
    microbatch on one device: GPipe's F, BW); the entry checks it in its own variant."""
    problem = uniform_problem(p=1, m=1, t_f=1.0, t_b=1.0, t_w=1.0)
    result = solve(problem, solver="cpsat", time_limit=5)
    assert "rejected" not in caplog.text
    assert result.status == "optimal"
    assert result.schedule.solver.name == "cpsat"
    assert {op.key.kind for op in result.schedule.ops} == {OpKind.F, OpKind.BW}
    check(result, problem)


def test_zero_latency_reaches_the_bound():
    # Unit costs, no latency, cap 2p: the last device's fill + load + W tail is attainable.
    problem = uniform_problem(p=4, m=8)
    result = solve(problem, time_limit=10)
    assert result.status == "optimal"
    assert result.objective == pytest.approx(3 + 16 + 8)
    assert result.gap == pytest.approx(0.0)
    check(result, problem)


def test_span_objective_reaches_the_load():
    # Without latency and with cap 2p, each device can run its 6 * 3 units back to back.
    problem = uniform_problem(p=3, m=6, m_w=0.5, objective="span")
    result = solve(problem, time_limit=10)
    assert result.status == "optimal"
    assert result.objective == pytest.approx(18.0)
    assert result.objective == pytest.approx(max(result.schedule.metrics.span))
    check(result, problem)


def _random_problem(rng: random.Random) -> Problem:
    p, m = rng.choice([2, 3]), rng.choice([3, 4])
    placement = rng.choice(["loop", "v"])
    devices_of = list(range(p)) if placement == "loop" else list(range(p)) + list(range(p))[::-1]
    stages = []
    for d in devices_of:
        m_b = rng.choice([0.5, 1.0])
        stages.append(Stage(device=d, t_f=rng.choice([1.0, 1.5, 2.0]),
                            t_b=rng.choice([1.0, 2.0]), t_w=rng.choice([0.5, 1.0]),
                            m_b=m_b, m_w=m_b * 0.5))  # fmt: skip
    draft = Problem(p=p, m=m, stages=tuple(stages), placement=placement,
                    devices=tuple(Device(cap=100.0) for _ in range(p)),
                    t_comm=rng.choice([0.0, 0.1]))  # fmt: skip
    cap = min_feasible_cap(draft) * rng.choice([1.0, 1.5, 2.5])
    return draft.replace(devices=tuple(Device(cap=cap) for _ in range(p)))


@pytest.mark.parametrize("seed", range(5))
def test_never_worse_than_warm_start(seed):
    problem = _random_problem(random.Random(seed))
    result = solve(problem, time_limit=2, seed=seed)
    assert result.warm_start is not None
    assert result.objective <= result.warm_start.objective + 1e-9
    check(result, problem)


def test_same_seed_same_schedule():
    problem = uniform_problem(p=3, m=6, t_comm=0.1, m_w=0.3, cap=3.0, t_b=1.3)
    first = solve(problem, time_limit=10, seed=7)
    second = solve(problem, time_limit=10, seed=7)
    assert first.schedule.ops == second.schedule.ops


def test_infeasible_cap_reports_the_minimum():
    # V placement, p = 2: device 0 holds stages 0 and 3, and one microbatch keeps both
    # chunks (m_b / 2 each) at once: the smallest cap is m_b.
    problem = uniform_problem(p=2, m=3, placement="v", v=2, cap=1.0)
    assert min_feasible_cap(problem) == pytest.approx(1.0)
    check(solve(problem, time_limit=5), problem)
    short = problem.replace(devices=tuple(Device(cap=0.99) for _ in range(2)))
    with pytest.raises(InfeasibleError) as info:
        solve(short, time_limit=5)
    assert info.value.min_cap == pytest.approx(1.0)
    # The model itself agrees that nothing fits below the minimum (no shortcut taken).
    backend = solve_cpsat(short, dag_for(short), SolveOptions(time_limit=5, threads=1))
    assert backend.status == "infeasible"


def test_infeasible_cap_minimum_with_offload_and_recompute():
    problem = uniform_problem(p=2, m=2, placement="v", v=2, cap=0.5, offload=True)
    assert min_feasible_cap(problem) == pytest.approx(0.5)  # the lower chunk fully offloaded
    assert min_feasible_cap(problem, (0.5,)) == pytest.approx(0.75)
    stages = tuple(s.__class__(**{**_fields(s), "m_in": 0.1}) for s in problem.stages)
    recomputed = problem.replace(offload=False, recompute=True, stages=stages)
    assert min_feasible_cap(recomputed) == pytest.approx(0.6)
    with pytest.raises(InfeasibleError) as info:
        solve(recomputed.replace(devices=tuple(Device(cap=0.55) for _ in range(2))))
    assert info.value.min_cap == pytest.approx(0.6)


def _fields(stage: Stage) -> dict:
    return {name: getattr(stage, name) for name in Stage.__slots__}


def test_offload_used_when_the_cap_demands_it():
    problem = uniform_problem(p=2, m=3, placement="v", v=2, cap=0.75, offload=True)
    problem = problem.replace(
        stages=tuple(
            s.__class__(**{**_fields(s), "t_offload": 0.2, "t_reload": 0.2}) for s in problem.stages
        )  # fmt: skip
    )
    result = solve(problem, time_limit=3)
    kinds = {op.kind for op in result.schedule.ops}
    assert OpKind.OFFLOAD in kinds and OpKind.RELOAD in kinds
    check(result, problem)


def test_recompute_used_when_allowed_and_needed():
    problem = uniform_problem(p=2, m=3, placement="v", v=2, cap=0.75, recompute=True)
    problem = problem.replace(
        stages=tuple(s.__class__(**{**_fields(s), "m_in": 0.1}) for s in problem.stages)
    )
    result = solve(problem, time_limit=3)
    assert any(op.kind is OpKind.R for op in result.schedule.ops)
    check(result, problem)


def test_offload_not_used_when_it_cannot_help():
    # Generous cap: offloading costs copy time and saves nothing the objective sees.
    problem = uniform_problem(p=2, m=3, cap=4.0, offload=True)
    result = solve(problem, time_limit=10)
    assert result.status == "optimal"
    no_offload = solve(problem.replace(offload=False), time_limit=10)
    assert result.objective == pytest.approx(no_offload.objective)


def test_costs_without_a_decimal_scale():
    # Times that no power of ten makes integer: the model rounds, the API re-times exactly.
    problem = uniform_problem(p=2, m=4, t_f=1 / 3, t_b=2**0.5 / 2, t_w=1 / 7, t_comm=0.01, cap=2.0)
    result = solve(problem, time_limit=3)
    check(result, problem)


def test_cli_infeasible_cap_exits_2(tmp_path, capsys):
    from pp_opt.cli import main

    spec = tmp_path / "p.toml"
    spec.write_text(
        'p = 2\nm = 2\nplacement = "loop"\n[stage]\nt_f = 1.0\nt_b = 1.0\nt_w = 1.0\n'
        "m_b = 1.0\n[device]\ncap = 4.0\n"
    )
    with pytest.raises(SystemExit) as info:
        main(["solve", str(spec), "--cap", "0.5", "--quiet"])
    assert info.value.code == 2
    assert "raise --cap to at least 1 (unit: M_B" in capsys.readouterr().err
    out = tmp_path / "s.json"
    try:
        main(["solve", str(spec), "--time-limit", "2", "--quiet", "-o", str(out)])
    except SystemExit as done:
        assert done.code in (0, None)
    assert out.is_file()


def test_offload_halves_memory_at_classic_speed():
    # Copies take a sixth of a microbatch's compute: ZB-H1's timing at half its memory.
    from pp_opt.orders import baseline

    def problem_at(cap: float, offload: bool) -> Problem:
        stages = tuple(
            Stage(device=d, t_f=1.0, t_b=1.0, t_w=1.0, m_b=1.0, t_offload=0.5, t_reload=0.5)
            for d in range(4)
        )
        devices = tuple(Device(cap=cap) for _ in range(4))
        return Problem(p=4, m=8, stages=stages, devices=devices, t_comm=0.05, offload=offload)

    reference = baseline("zb-h1", problem_at(4.0, False)).metrics.makespan
    problem = problem_at(2.0, True)
    result = solve(problem, time_limit=3)
    assert any(op.kind is OpKind.OFFLOAD for op in result.schedule.ops)
    assert result.objective <= reference + 1e-9
    check(result, problem)
