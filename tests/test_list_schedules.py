"""The memory-aware list schedules under tight caps."""

from __future__ import annotations

import pytest

from pp_opt.errors import PPOptError
from pp_opt.orders import candidates
from pp_opt.orders.registry import get
from pp_opt.problem import uniform_problem
from pp_opt.simulator import simulate
from pp_opt.validator import check_schedule


def _tight_v(cap: float):  # type: ignore[no-untyped-def]
    return uniform_problem(p=3, m=8, t_f=1.0, t_b=1.2, t_w=0.6, m_b=1.0, m_w=0.75, cap=cap,
                           placement="v", v=2, t_comm=0.05)  # fmt: skip


def _makespan(name: str, cap: float) -> float | None:
    try:
        return check_schedule(simulate(get(name).generator(_tight_v(cap)))).objective_value()
    except PPOptError:
        return None


@pytest.mark.parametrize("cap", [3.5, 4.0, 5.0])
def test_an_in_flight_limit_beats_the_greedy_and_the_controllable_memory_schedules(
    cap: float,
) -> None:
    """Taking a forward whenever memory allows starves the V's second chunk; limiting the
    microbatches in flight does better than that greedy and than V-Half and V-Min."""
    limited = _makespan("greedy-bfw-limited", cap)
    others = [m for n in ("greedy-bfw", "greedy-lazy-w", "v-half", "v-min")
              if (m := _makespan(n, cap)) is not None]  # fmt: skip
    assert limited is not None and others
    assert limited < min(others) - 0.05


def test_the_limited_greedy_is_a_warm_start_and_names_its_limit() -> None:
    found = candidates(_tight_v(4.0))
    assert found[0].name.startswith("greedy-bfw-limited-k")
    assert found[0].objective == pytest.approx(23.6, abs=0.05)


def test_a_given_warm_start_competes_with_the_generated_ones() -> None:
    """A plan refines a candidate from its screening schedule; a generated warm start that
    is better (here the limited greedy against the fallback) is taken instead."""
    from pp_opt.solvers import solve

    problem = _tight_v(4.0)
    given = check_schedule(simulate(get("fallback").generator(problem)))
    result = solve(problem, time_limit=3, threads=1, seed=0, warm_start=given)
    assert result.warm_start is not None
    assert result.warm_start.name.startswith("greedy-bfw-limited")
    assert result.objective <= 23.6 + 0.05 < given.objective_value()
