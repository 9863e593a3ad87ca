"""The time limit holds on the largest inputs too (DAG, warm starts and
checks count against it): ``pp-opt solve`` of 120,000 ops with ``--time-limit 3`` took
14.2 s on main; the issue asks for 5.2 s on 2 cores."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pp_opt
from pp_opt.dag import op_count
from pp_opt.problem import uniform_problem
from pp_opt.problem_io import problem_to_dict


@pytest.mark.timing
@pytest.mark.slow
def test_a_huge_problem_keeps_its_time_limit(tmp_path: Path) -> None:
    problem = uniform_problem(p=4, m=10_000)
    assert op_count(problem) == 120_000
    path, out = tmp_path / "huge.json", tmp_path / "s.json"
    path.write_text(json.dumps({"format": "pp-opt.problem", **problem_to_dict(problem)}))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pp_opt", "solve", str(path), "--time-limit", "3", "-q",
         "-o", str(out)], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0, done.stderr
    # The issue asks for 5.2 s of wall time on 2 cores (4.0-4.3 s measured on this
    # project's VM under a load of 2; 10-12 s on main). A machine that other jobs share
    # stretches even CPU time, so the test leaves a margin: main takes 10 s of CPU.
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu <= 6.5, (cpu, wall)
    assert wall <= 2 * 5.2
    schedule = pp_opt.load_schedule(out)
    assert schedule.solver.seconds <= 3 * 1.05 + 2  # the README's promise for the solve
    assert pp_opt.validate(schedule) == []


def test_op_count_is_the_dag_size() -> None:
    from pp_opt.dag import dag_for
    from pp_opt.order import Variant

    problem = uniform_problem(p=2, m=3, placement="v", v=2, offload=True, recompute=True)
    for variant in (Variant(True, True, True), Variant(False, False, False)):
        assert op_count(problem, variant) == dag_for(problem, variant).number_of_nodes()
