"""Problem model: placements, checks with clear messages, TOML specs, re-splitting."""

from __future__ import annotations

import pytest

from pp_opt.errors import InfeasibleError, ProblemError
from pp_opt.placement import stage_devices
from pp_opt.problem import Device, Stage, uniform_problem
from pp_opt.problem_io import problem_from_dict, problem_from_spec, problem_to_dict, resplit


def test_placements() -> None:
    assert stage_devices("loop", 3, 2) == (0, 1, 2, 0, 1, 2)
    assert stage_devices("v", 3, 2) == (0, 1, 2, 2, 1, 0)
    assert stage_devices([1, 0, 1, 0], 2, 1) == (1, 0, 1, 0)


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: Stage(device=0, t_f=-1.0, t_b=1.0, t_w=1.0), "t_f"),
        (lambda: Stage(device=0, t_f=1.0, t_b=1.0, t_w=1.0, m_b=1.0, m_w=2.0), "m_w"),
        (lambda: Device(cap=1.0, static=2.0), "cap"),
        (lambda: uniform_problem(p=0, m=4), "p"),
        (lambda: uniform_problem(p=2, m=0), "m"),
        (lambda: uniform_problem(p=2, m=2, placement="v", v=3), "v"),
        (lambda: uniform_problem(p=2, m=2, placement="ring"), "placement"),
        (lambda: uniform_problem(p=2, m=2, objective="speed"), "objective"),
        (lambda: uniform_problem(p=2, m=2, t_comm=float("nan")), "t_comm"),
    ],
)
def test_bad_values_name_their_field(make, field: str) -> None:
    with pytest.raises(ProblemError) as err:
        make()
    assert err.value.field == field
    assert "\n" not in str(err.value)


SPEC = {
    "p": 2,
    "m": 4,
    "t_comm": 0.1,
    "stage": {"t_f": 1.0, "t_b": 1.0, "t_w": 0.5, "m_b": 1.0, "m_w": 0.25},
}


def test_spec_defaults_cap_to_2p_activations() -> None:
    problem = problem_from_spec(SPEC)
    assert problem.num_stages == 2
    assert [d.cap for d in problem.devices] == [4.0, 4.0]
    assert problem.stages[1].m_w == 0.25


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"colour": "red"}, "colour"),
        ({"stage": {"t_f": 1.0, "t_b": 1.0}}, "stage.t_w"),
        ({"stage": {**SPEC["stage"], "t_x": 1.0}}, "stage.t_x"),
        ({"p": "two"}, "p"),
        ({"placement": [0, 0]}, "placement"),
        ({"host_links": [[0, 5]]}, "host_links"),
        ({"offload": "yes"}, "offload"),
    ],
)
def test_spec_errors(change: dict, field: str) -> None:
    with pytest.raises(ProblemError) as err:
        problem_from_spec({**SPEC, **change})
    assert err.value.field == field


def test_cap_below_static_is_infeasible_with_the_minimum() -> None:
    """Finding 10: a cap below the static memory is an infeasible cap (exit 2) that says the
    smallest cap that works, not a bad-input error without it."""
    with pytest.raises(InfeasibleError) as err:
        problem_from_spec({**SPEC, "device": {"cap": 1.0, "static": 3.0}})
    assert err.value.exit_code == 2
    assert err.value.min_cap == pytest.approx(3.0 + 1.0)  # static + one activation
    assert "at least 4 " in str(err.value)


def test_dict_round_trip() -> None:
    problem = problem_from_spec({**SPEC, "placement": "v", "host_links": [[0, 1]], "offload": True})
    assert problem_from_dict(problem_to_dict(problem)) == problem


def test_resplit_divides_device_costs() -> None:
    problem = uniform_problem(p=4, m=8, t_f=2.0, t_b=2.0, t_w=1.0, m_b=1.0, m_w=0.5)
    v_problem = resplit(problem, "v", 2)
    assert v_problem.num_stages == 8
    assert v_problem.stages[5].device == 2
    assert v_problem.stages[0].t_f == 1.0 and v_problem.stages[0].m_b == 0.5
    for d in range(4):
        own = [v_problem.stages[s] for s in v_problem.stages_on(d)]
        assert sum(st.t_w for st in own) == pytest.approx(1.0)
        assert sum(st.m_w for st in own) == pytest.approx(0.5)
    with pytest.raises(ProblemError):
        resplit(problem, "ring", 2)


@pytest.mark.parametrize(
    ("change", "field"),
    [({"stage": 3}, "stage"), ({"stages": [1, 2]}, "stages"), ({"device": "big"}, "device")],
)
def test_spec_tables_must_be_tables(change: dict, field: str) -> None:
    with pytest.raises(ProblemError) as err:
        problem_from_spec({**SPEC, **change})
    assert err.value.field == field
