"""The Zero Bubble paper's greedy schedulers as warm starts: the paper's bubble rates
(docs/design.md §7) on the 1.5B configuration, valid schedules under the caps."""

from __future__ import annotations

from pathlib import Path

import pytest

from pp_opt.errors import NoOrderError
from pp_opt.orders import candidates
from pp_opt.orders.greedy.zb_greedy import zb_greedy
from pp_opt.orders.greedy.zb_v_greedy import zb_v_greedy
from pp_opt.problem import Device, uniform_problem
from pp_opt.problem_io import load_problem, resplit
from pp_opt.schedule import Schedule
from pp_opt.simulator import simulate
from pp_opt.validator import check_schedule

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def zb_1_5b():
    return load_problem(EXAMPLES / "zb-1.5b.toml").replace(objective="span")


def _check(problem, schedule: Schedule) -> None:
    check_schedule(schedule)
    assert schedule.problem == problem
    for peak, device in zip(schedule.metrics.peak_memory, problem.devices, strict=True):
        assert peak <= device.cap + 1e-9


def test_loop_reaches_zb_2p(zb_1_5b):
    schedule = simulate(zb_greedy(zb_1_5b))
    _check(zb_1_5b, schedule)
    assert schedule.metrics.bubble_rate <= 0.0433 + 0.002


def test_v_reaches_zb_v(zb_1_5b):
    problem = resplit(zb_1_5b, "v", 2)
    problem = problem.replace(devices=tuple(Device(cap=float(problem.p)) for _ in problem.devices))
    schedule = simulate(zb_v_greedy(problem))
    _check(problem, schedule)
    assert schedule.metrics.bubble_rate <= 0.0702 + 0.002


def test_tight_caps_give_valid_schedules_or_none():
    # At the 1F1B cap the rules may get stuck; whatever they return must fit.
    problem = uniform_problem(p=4, m=8, t_b=1.0, t_w=0.5, m_w=0.3, t_comm=0.1, cap=4.0)
    try:
        order = zb_greedy(problem.replace(objective="span"))
    except NoOrderError:
        return
    check_schedule(simulate(order))


def test_registered_as_warm_start(zb_1_5b):
    names = [candidate.name for candidate in candidates(zb_1_5b)]
    assert any(name.startswith("zb-auto") for name in names)


def test_other_shapes_give_nothing():
    problem = uniform_problem(p=4, m=8, placement="loop", v=2)
    with pytest.raises(NoOrderError):
        zb_greedy(problem)
    with pytest.raises(NoOrderError):
        zb_v_greedy(problem)
