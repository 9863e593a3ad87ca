"""Classic schedules: published bubble rates, closed forms, validity, and the cap path."""

from __future__ import annotations

from pathlib import Path

import pytest

from pp_opt.cli.common import flag
from pp_opt.errors import InfeasibleError, ProblemError
from pp_opt.ops import OpKind
from pp_opt.order import Order
from pp_opt.orders import REGISTRY, baseline, baseline_names, best_baseline, fits_cap
from pp_opt.problem import Device, Problem, Stage, uniform_problem
from pp_opt.problem_io import load_problem
from pp_opt.simulator import simulate
from pp_opt.validator import validate

FUSED_BACKWARD = frozenset({"gpipe", "1f1b", "interleaved-1f1b"})


def baseline_order(name: str, problem: Problem) -> Order:
    return REGISTRY[name].generator(problem)


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# Zero Bubble paper, docs/design.md §7: (example, 1F1B, ZB-H1, ZB-H2).
PUBLISHED = [
    ("zb-1.5b", 0.2431, 0.1585, 0.1083),
    ("zb-6.2b", 0.2347, 0.1323, 0.0698),
    ("zb-14.6b", 0.2552, 0.1397, 0.0672),
    ("zb-28.3b", 0.2646, 0.1421, 0.0641),
]


def _bubble_rate(name: str, problem: Problem) -> float:
    """Simulated only: baseline adds the validator, checked below on smaller problems."""
    return simulate(baseline_order(name, problem)).metrics.bubble_rate


def _bubble(name: str, problem: Problem) -> tuple[float, float]:
    """``max span - busy of the busiest device`` and the peak memory over devices."""
    metrics = baseline(name, problem).metrics
    return max(metrics.span) - max(metrics.busy), max(metrics.peak_memory)


@pytest.mark.parametrize(("example", "one_f_one_b", "zb_h1", "zb_h2"), PUBLISHED)
def test_published_bubble_rates(
    example: str, one_f_one_b: float, zb_h1: float, zb_h2: float
) -> None:
    problem = load_problem(EXAMPLES / f"{example}.toml")
    assert _bubble_rate("1f1b", problem) == pytest.approx(one_f_one_b, abs=0.002)
    assert _bubble_rate("zb-h1", problem) == pytest.approx(zb_h1, abs=0.002)
    assert _bubble_rate("zb-h2", problem) == pytest.approx(zb_h2, abs=0.003)


def test_zb_v_on_the_1_5b_costs() -> None:
    problem = load_problem(EXAMPLES / "zb-1.5b.toml")
    schedule = baseline("zb-v", problem)
    assert schedule.problem.placement == "v"
    assert schedule.metrics.bubble_rate <= 0.08  # the paper's greedy ZB-V reaches .0702
    assert max(schedule.metrics.peak_memory) <= problem.p * 1.0 + 1e-9  # p M_B, static 0


def test_interleaved_1f1b_on_the_1_5b_costs() -> None:
    problem = load_problem(EXAMPLES / "zb-1.5b.toml")
    schedule = baseline("interleaved-1f1b", problem)
    assert (schedule.problem.placement, schedule.problem.v) == ("loop", 2)
    assert schedule.metrics.bubble_rate == pytest.approx(0.1395, abs=0.002)


# Closed forms with t_comm = 0 (docs/design.md §7); costs (t_f, t_b, t_w) and the
# (p, m) where each is exact: 1F1B and GPipe always; ZB-H1 for m >= p and
# t_w <= t_f; ZB-H2 for m >= 2p - 1, t_w <= t_f and 2 t_w <= t_f + t_b.
COSTS = [(1.0, 1.0, 1.0), (2.0, 3.0, 1.0), (3.0, 1.0, 2.0), (1.5, 2.0, 0.5)]
SIZES = [(2, 2), (2, 5), (3, 3), (3, 7), (4, 8), (4, 13), (6, 12), (6, 20)]


def _unit(p: int, m: int, costs: tuple[float, float, float], m_b: float = 2.0) -> Problem:
    t_f, t_b, t_w = costs
    return uniform_problem(
        p=p, m=m, t_f=t_f, t_b=t_b, t_w=t_w, m_b=m_b, m_w=0.4 * m_b, cap=2 * m * m_b
    )


@pytest.mark.parametrize("costs", COSTS)
@pytest.mark.parametrize(("p", "m"), [(1, 3), (3, 1), (4, 2), *SIZES])
def test_closed_forms_of_gpipe_and_1f1b(p: int, m: int, costs: tuple[float, float, float]) -> None:
    problem = _unit(p, m, costs)
    t_f, t_b, t_w = costs
    expected = (p - 1) * (t_f + t_b + t_w)
    assert _bubble("1f1b", problem) == pytest.approx((expected, min(p, m) * 2.0))
    assert _bubble("gpipe", problem) == pytest.approx((expected, m * 2.0))


@pytest.mark.parametrize("costs", COSTS)
@pytest.mark.parametrize(("p", "m"), SIZES)
def test_closed_forms_of_zb_h1_and_zb_h2(p: int, m: int, costs: tuple[float, float, float]) -> None:
    problem = _unit(p, m, costs)
    t_f, t_b, t_w = costs
    assert _bubble("zb-h1", problem) == pytest.approx(((p - 1) * (t_f + t_b - t_w), p * 2.0))
    if m >= 2 * p - 1:
        expected = ((p - 1) * (t_f + t_b - 2 * t_w), (2 * p - 1) * 2.0)
        assert _bubble("zb-h2", problem) == pytest.approx(expected)


def test_zb_h1_closed_form_needs_t_w_at_most_t_f() -> None:
    """Past ``t_w > t_f`` the held-back W no longer fits the tail: more bubble than the form."""
    problem = _unit(4, 8, (1.0, 1.0, 2.0))
    bubble, _ = _bubble("zb-h1", problem)
    assert bubble > 3 * (1.0 + 1.0 - 2.0) + 0.5


def test_zb_h2_has_no_bubble_with_equal_costs() -> None:
    metrics = baseline("zb-h2", uniform_problem(p=4, m=8, m_w=0.5)).metrics
    assert metrics.span == pytest.approx([24.0] * 4)
    assert metrics.bubble_rate == pytest.approx(0.0)


def _explicit(p: int, m: int) -> Problem:
    """One stage per device, devices in another order than the stages."""
    order = [1, 0, 3, 2][:p] if p == 4 else list(reversed(range(p)))
    stages = tuple(Stage(device=d, t_f=1.0, t_b=1.2, t_w=0.6, m_w=0.3) for d in order)
    devices = tuple(Device(cap=4.0 * p) for _ in range(p))
    return Problem(p=p, m=m, stages=stages, devices=devices, placement="explicit", t_comm=0.1)


VALIDITY_PROBLEMS = {
    "loop": uniform_problem(p=4, m=8, t_w=0.5, m_w=0.4, t_comm=0.1, cap=16.0),
    "loop-v3": uniform_problem(p=3, m=7, t_w=0.5, m_w=0.4, t_comm=0.2, v=3, cap=16.0),
    "v": uniform_problem(p=4, m=6, placement="v", v=2, m_w=0.3, t_comm=0.1, cap=16.0),
    "explicit": _explicit(4, 6),
    "one-device": uniform_problem(p=1, m=3, t_comm=0.1, cap=8.0),
    "few-microbatches": uniform_problem(p=5, m=2, t_comm=0.3, cap=10.0),
}


@pytest.mark.parametrize("kind", list(VALIDITY_PROBLEMS))
@pytest.mark.parametrize("name", baseline_names())
def test_every_baseline_passes_the_validator(name: str, kind: str) -> None:
    schedule = baseline(name, VALIDITY_PROBLEMS[kind])
    assert validate(schedule) == []
    assert schedule.solver.name == name
    assert schedule.solver.status == "heuristic"
    assert schedule.solver.objective == pytest.approx(schedule.metrics.makespan)
    kinds = {op.kind for op in schedule.ops}
    if name in FUSED_BACKWARD:
        assert kinds == {OpKind.F, OpKind.BW}
    else:
        assert kinds == {OpKind.F, OpKind.B, OpKind.W}


@pytest.mark.parametrize("name", baseline_names())
def test_no_deadlock_for_any_small_size(name: str) -> None:
    for p in range(1, 6):
        for m in range(1, 2 * p + 3):
            problem = uniform_problem(p=p, m=m, t_w=0.5, t_comm=0.1)
            simulate(baseline_order(name, problem))  # raises DeadlockError if it cannot run


@pytest.mark.parametrize(
    ("name", "placement", "v", "expected"),
    [
        ("1f1b", "v", 2, ("loop", 1)),
        ("zb-h2", "loop", 2, ("loop", 1)),
        ("zb-v", "loop", 1, ("v", 2)),
        ("zb-v", "v", 2, ("v", 2)),
        ("interleaved-1f1b", "loop", 1, ("loop", 2)),
        ("interleaved-1f1b", "loop", 3, ("loop", 3)),
        ("interleaved-1f1b", "v", 2, ("loop", 2)),
    ],
)
def test_placement_each_baseline_runs_on(
    name: str, placement: str, v: int, expected: tuple[str, int]
) -> None:
    problem = uniform_problem(p=4, m=8, placement=placement, v=v, t_comm=0.1)
    scheduled = baseline_order(name, problem).problem
    assert (scheduled.placement, scheduled.v) == expected
    assert (scheduled is problem) == (expected == (placement, v))
    # Re-splitting keeps each device's total work.
    for d in range(problem.p):
        assert sum(scheduled.stages[s].t_f for s in scheduled.stages_on(d)) == pytest.approx(1.0)


def test_infeasible_names_the_cap_it_needs() -> None:
    problem = uniform_problem(p=4, m=8, cap=5.0, static=2.0)  # 1F1B needs 4 activations + 2
    with pytest.raises(InfeasibleError) as caught:
        baseline("1f1b", problem)
    assert caught.value.min_cap == pytest.approx(6.0)
    assert str(caught.value) == (
        "1f1b needs 6 (activation + static) on device 0 but its cap is 5; raise cap to at least "
        "6 (unit: M_B, one activation)"
    )
    assert "raise --cap to at least 6 " in caught.value.describe(flag)  # as the CLI says
    raised = problem.replace(devices=tuple(Device(cap=6.0, static=2.0) for _ in range(4)))
    assert fits_cap(baseline("1f1b", raised))


def test_best_baseline_is_the_fastest_that_fits() -> None:
    problem = uniform_problem(p=4, m=8, t_comm=0.05, cap=4.0)  # 1F1B and ZB-H1 fit, ZB-H2 not
    best = best_baseline(problem)
    assert best is not None and best.solver.name == "zb-h1"
    assert best.problem is problem and fits_cap(best)
    roomy = best_baseline(problem.replace(devices=tuple(Device(cap=8.0) for _ in range(4))))
    assert roomy is not None and roomy.solver.name == "zb-h2"
    assert best_baseline(problem.replace(devices=tuple(Device(cap=3.0) for _ in range(4)))) is None


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(ProblemError, match="unknown 'zb-h3'; use one of gpipe, 1f1b"):
        baseline("zb-h3", uniform_problem(p=2, m=2))
    assert baseline_names() == [name for name, entry in REGISTRY.items() if entry.baseline]


def test_zero_bubble_needs_split_backward() -> None:
    problem = uniform_problem(p=2, m=4, split_backward=False)
    with pytest.raises(ProblemError, match="split_backward"):
        baseline("zb-h1", problem)
    assert baseline("1f1b", problem).metrics.makespan > 0
