"""Byte-identical schedule JSON against files saved before the architecture refactor.

``tests/data/golden`` holds what the tool wrote for ``examples/small.toml`` (every
classic baseline, and the CP-SAT solve proved optimal with seed 0) with
``solver.seconds`` zeroed. A change in an order generator, the simulator, the metrics,
the CP-SAT model or the JSON writer shows up here as a byte difference.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pp_opt import baseline, load_problem, solve
from pp_opt.schedule_io import dumps_schedule

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "data" / "golden"
BASELINES = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v"]


@pytest.fixture(scope="module")
def small():
    return load_problem(ROOT / "examples" / "small.toml")


@pytest.mark.parametrize("name", BASELINES)
def test_baseline_json_is_byte_identical(small, name: str) -> None:
    schedule = baseline(name, small)
    schedule.solver.seconds = 0.0
    assert dumps_schedule(schedule) == (GOLDEN / f"small.{name}.json").read_text()


def test_optimal_solve_json_is_byte_identical(small) -> None:
    result = solve(small, time_limit=60, seed=0, objective="makespan")
    assert result.status == "optimal"
    result.schedule.solver.seconds = 0.0
    assert dumps_schedule(result.schedule) == (GOLDEN / "small.solve-makespan.json").read_text()
