"""Every public constructor checks its arguments' types and names them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pp_opt import Device, Problem, ProblemError, Stage, uniform_problem

CALLS: list[tuple[str, Callable[[], object]]] = [
    ("t_f", lambda: uniform_problem(p=4, m=8, t_f="x")),  # a TypeError on main
    ("m_b", lambda: uniform_problem(p=4, m=8, m_b=None)),
    ("static", lambda: uniform_problem(p=4, m=8, static=[1])),
    ("cap", lambda: uniform_problem(p=4, m=8, cap="1")),  # accepted on main
    ("t_comm", lambda: uniform_problem(p=4, m=8, t_comm="0")),
    ("v", lambda: uniform_problem(p=4, m=8, v=1.5)),
    ("device", lambda: Stage(device="0", t_f=1, t_b=1, t_w=1)),  # accepted on main
    ("host_links", lambda: uniform_problem(p=4, m=8, host_links=5)),  # a TypeError on main
    ("host_links", lambda: uniform_problem(p=4, m=8, host_links=((0, "1"),))),
    ("extra", lambda: uniform_problem(p=4, m=8, extra=[])),
    ("cap", lambda: Device(cap="3")),
    (
        "stages",
        lambda: Problem(
            p=1, m=1, stages=[Stage(device=0, t_f=1, t_b=1, t_w=1)], devices=(Device(cap=1),)
        ),
    ),  # fmt: skip
]


@pytest.mark.parametrize(("name", "call"), CALLS, ids=[name for name, _ in CALLS])
def test_constructor_errors_name_the_argument(name: str, call: Callable[[], object]) -> None:
    with pytest.raises(ProblemError) as err:
        call()
    assert err.value.field == name, str(err.value)
