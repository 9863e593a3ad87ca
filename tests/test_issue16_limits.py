"""Issue 16, item 3: the time limit holds on the largest inputs too (DAG, warm starts and
checks count against it): 120,000 ops with a 3 s limit took 13 s on main."""

from __future__ import annotations

import time

import pytest

import pp_opt
from pp_opt.dag import op_count
from pp_opt.problem import uniform_problem


@pytest.mark.slow
def test_a_huge_problem_keeps_its_time_limit() -> None:
    problem = uniform_problem(p=4, m=10_000)
    assert op_count(problem) == 120_000
    started, cpu = time.perf_counter(), time.process_time()
    result = pp_opt.solve(problem, time_limit=3)
    # The README's promise, in the CPU time of this process: the wall time of a machine
    # that other jobs share (this project's: 2 cores, 4 test runs) can be twice as long.
    assert time.process_time() - cpu <= 3 * 1.05 + 2
    assert time.perf_counter() - started <= 2 * (3 * 1.05 + 2)
    assert pp_opt.validate(result.schedule) == []
    assert len(result.schedule.ops) in (80_000, 120_000)  # fused (1F1B) or split backward


def test_op_count_is_the_dag_size() -> None:
    from pp_opt.dag import dag_for
    from pp_opt.order import Variant

    problem = uniform_problem(p=2, m=3, placement="v", v=2, offload=True, recompute=True)
    for variant in (Variant(True, True, True), Variant(False, False, False)):
        assert op_count(problem, variant) == dag_for(problem, variant).number_of_nodes()
