"""Native code cannot take a run down; each backend and the search run in a child
process (pp_opt.solvers.process.isolation), and a crash there costs only that job's answer."""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pp_opt
from pp_opt.cli import exit_codes
from pp_opt.problem import uniform_problem
from pp_opt.solvers.process.isolation import FAULT_ENV
from pp_opt.validator import validate

ROOT = Path(__file__).resolve().parent.parent
SMALL = str(ROOT / "examples" / "small.toml")


def _cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pp_opt", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={**os.environ, **(env or {})})  # fmt: skip


@pytest.mark.timing
@pytest.mark.parametrize(
    ("fault", "backend", "how"),
    [
        ("backend:abort", "cpsat", "SIGABRT"),
        ("search:kill", "search", "SIGKILL"),
        ("fluid:abort", "fluid bound", "SIGABRT"),
    ],
)
def test_a_crashing_backend_still_writes_a_valid_schedule(
    tmp_path: Path, fault: str, backend: str, how: str
) -> None:
    out = tmp_path / "s.json"
    # Large enough (over FULL_MODEL_ALONE_OPS) and tight enough that the search follows the
    # full model unproved: the faults of both phases then happen.
    problem = tmp_path / "p.toml"
    text = Path(SMALL).read_text().replace("m = 8 ", "m = 60 ").replace("cap = 8.0", "cap = 3.0")
    problem.write_text(text)
    # The fluid bound runs for makespan only (60 microbatches: 180 ops on each device), and
    # from FLUID_MIN_SECONDS (a tenth of the limit).
    extra = ("--objective", "makespan", "--time-limit", "6") if fault.startswith("fluid") else (
        "--time-limit", "4")  # fmt: skip
    done = _cli("solve", str(problem), "-q", "-o", str(out), *extra,
                env={FAULT_ENV: fault})  # fmt: skip
    assert done.returncode == exit_codes.BACKEND_FAILED, done.stderr
    assert "Traceback" not in done.stderr
    assert f"the {backend} backend died ({how})" in done.stderr
    schedule = pp_opt.load_schedule(out)
    assert validate(schedule) == []
    assert schedule.solver.extra["backend_failure"] == {"backend": backend, "how": how}


@pytest.mark.parametrize("solver", ["milp", "milp-highs"])
def test_a_crashing_milp_backend_leaves_the_warm_start(
    solver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, "backend:exit")
    problem = uniform_problem(p=2, m=4, t_comm=0.1, cap=3.0)
    result = pp_opt.solve(problem, solver=solver, time_limit=3, threads=1)
    assert validate(result.schedule) == []
    assert result.warm_start is not None
    assert result.objective <= result.warm_start.objective + 1e-9
    extra = result.schedule.solver.extra
    assert extra["backend_failure"] == {"backend": solver, "how": "exit code 3"}
    assert extra["backend_status"] == "timeout"


def _children() -> set[str]:
    me = Path(f"/proc/{os.getpid()}/task")
    if not me.is_dir():
        pytest.skip("needs Linux /proc")
    children: set[str] = set()
    for task in os.listdir(me):
        children |= set((me / task / "children").read_text().split())
    return children


def test_no_child_outlives_a_solve() -> None:
    """Only the solve's own children count: a test worker may hold others (a process pool
    or a Ray runtime of an earlier test in the same worker)."""
    before = _children()
    pp_opt.solve(uniform_problem(p=2, m=4), time_limit=2, threads=1)
    assert _children() - before == set()


def _solve_in_worker(p: int) -> str:
    result = pp_opt.solve(uniform_problem(p=p, m=4, t_comm=0.1), time_limit=3, threads=1)
    assert validate(result.schedule) == []
    return json.dumps(result.schedule.solver.extra.get("backend_failure"))


def test_solve_inside_a_spawned_process_pool_worker() -> None:
    """The planner calls solve() from ProcessPoolExecutor (spawn) workers."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        assert list(pool.map(_solve_in_worker, [2, 3])) == ["null", "null"]


def test_the_printed_minimum_cap_of_a_profile_solves(tmp_path: Path) -> None:
    """Issue 16, item 1: at the minimum cap it printed, CP-SAT aborted (SIGABRT, exit 134,
    nothing written) on a hint its model rejects."""
    costs, out = tmp_path / "c.json", tmp_path / "s.json"
    made = _cli("profile", "--model", "llama2-7b", "--hardware", "a100-80gb", "--pp", "4",
                "--microbatches", "8", "--mbs", "1", "--seq", "4096", "-o", str(costs))  # fmt: skip
    assert made.returncode == 0, made.stderr
    low = _cli("solve", str(costs), "--cap", "28000000000", "--time-limit", "5")
    assert low.returncode == exit_codes.INFEASIBLE
    printed = re.search(r"raise --cap to at least (\d+) bytes", low.stderr)
    assert printed, low.stderr
    done = _cli("solve", str(costs), "--cap", printed.group(1), "--time-limit", "5", "-o", str(out))
    assert done.returncode == exit_codes.OK, done.stderr[-2000:]
    assert validate(pp_opt.load_schedule(out)) == []
