"""Issue 11, findings 2, 5, 6, 11: every run ends cleanly within its limit with its best
schedule, and what it returns is what the runtimes can run."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from order_helpers import overtaking_schedule

import pp_opt
from pp_opt.cli import exit_codes
from pp_opt.dag import dag_for
from pp_opt.ops import OpKey, OpKind
from pp_opt.orders import candidates
from pp_opt.problem import Problem, uniform_problem
from pp_opt.problem_overrides import problem_with_overrides
from pp_opt.runtime_rules import in_runtime_order, runtime_chains
from pp_opt.simulator import retime
from pp_opt.solvers.base import SolveOptions
from pp_opt.validator import validate

ROOT = Path(__file__).resolve().parent.parent
SMALL = str(ROOT / "examples" / "small.toml")


def with_copies(problem: Problem, t: float) -> Problem:
    stages = tuple(dataclasses.replace(st, t_offload=t, t_reload=t) for st in problem.stages)
    return problem.replace(stages=stages, offload=True)


# --- finding 2: zero-time copies are legal and never deadlock a re-timing ----------------


def test_finding2_zero_copy_times_retime_without_deadlock() -> None:
    problem = problem_with_overrides(ROOT / "examples" / "zb-1.5b.toml", cap=8.0, offload=True)
    assert all(st.t_offload == 0.0 for st in problem.stages)
    found = candidates(problem, names=["zb-h2", "zb-h1"])
    assert any(c.name.endswith("offload-links") for c in found)
    for candidate in found:
        again = retime(candidate.schedule)  # DeadlockError on main for zb-h2+offload-links
        assert again.objective_value() <= candidate.objective + 1e-9
        assert validate(again) == []


# --- finding 5: a failing progress callback or a closed stdout does not kill the run -----

RAISING = """
import pp_opt
from pp_opt.problem import uniform_problem
calls = []
def progress(update):
    calls.append(update)
    raise RuntimeError("callback failed")
problem = uniform_problem(p=4, m=8, t_comm=0.05, m_w=0.5, cap=3.0)
result = pp_opt.solve(problem, solver={solver!r}, time_limit=4, threads=2, progress=progress)
assert pp_opt.validate(result.schedule) == []
print("OK", len(calls), result.schedule.solver.status)
"""


@pytest.mark.parametrize("solver", ["cpsat", "milp", "milp-highs"])
def test_finding5_raising_progress_callback(solver: str) -> None:
    """On main the CP-SAT case aborts the process inside OR-Tools (exit 134)."""
    done = subprocess.run(
        [sys.executable, "-c", RAISING.format(solver=solver)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("OK 1 ")  # called once, then the search stopped
    assert "callback failed" in done.stderr  # said, not swallowed


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "pp_opt", *args]


def test_finding5_closed_stdout_keeps_the_result(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    solve = subprocess.Popen(
        _cli("solve", SMALL, "--cap", "3", "--time-limit", "3", "-o", str(out)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert solve.stdout is not None and solve.stderr is not None
    solve.stdout.read(10)  # `| head -c 10`
    solve.stdout.close()
    err = solve.stderr.read().decode()
    assert solve.wait(timeout=60) == exit_codes.OK, err
    assert "Traceback" not in err
    assert validate(pp_opt.load_schedule(out)) == []


# --- finding 6: signals end every backend cleanly, keeping the best schedule --------------


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found |= {int(x) for x in f.read().split()}
    return found


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize(("solver", "sig"), [("milp", signal.SIGTERM), ("cpsat", signal.SIGINT)])
def test_finding6_signal_writes_the_best_schedule(
    tmp_path: Path, solver: str, sig: signal.Signals
) -> None:
    out = tmp_path / "s.json"
    run = subprocess.Popen(
        _cli(
            "solve",
            SMALL,
            "--cap",
            "2.5",
            "--solver",
            solver,
            "--time-limit",
            "120",
            "-o",
            str(out),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert run.stdout is not None
    line = run.stdout.readline()  # the first progress line: the search is running
    assert "incumbent" in line, line
    children = _children(run.pid)
    if solver == "milp":
        deadline = time.monotonic() + 20
        while not children and time.monotonic() < deadline:  # CBC starts after the model
            time.sleep(0.1)
            children = _children(run.pid)
        assert children, "CBC did not start"
    started = time.monotonic()
    run.send_signal(sig)
    stdout, stderr = run.communicate(timeout=60)
    assert time.monotonic() - started < 15
    assert run.returncode == exit_codes.INTERRUPTED, stderr
    assert f"interrupted by {sig.name}: wrote the best schedule" in stderr
    assert validate(pp_opt.load_schedule(out)) == []
    for pid in children:  # CBC (or any child) did not outlive the run
        assert (
            not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
        )


# --- finding 11: the runtimes' order rule, in the validator and both models ---------------


def test_finding11_validator_refuses_out_of_order_loss_forwards() -> None:
    schedule = overtaking_schedule(uniform_problem(p=2, m=4, t_comm=0.1))
    rules = {v.rule for v in validate(schedule)}
    assert rules == {"runtime_order"}
    renumbered = in_runtime_order(schedule)
    assert validate(renumbered) == []
    assert renumbered.metrics.makespan == schedule.metrics.makespan


def test_finding11_both_models_hold_the_rule() -> None:
    """With offload the models used to order only stage 0's forwards, leaving the last
    stage free (a solved offload schedule ran F7, F5, F6 there)."""
    from ortools.sat.python import cp_model

    from pp_opt.solvers.cpsat.model import build_model as build_cpsat
    from pp_opt.solvers.milp.model import build_model as build_milp

    problem = with_copies(uniform_problem(p=2, m=3, t_comm=0.1, cap=2.0), 0.3)
    dag = dag_for(problem)
    built = build_cpsat(problem, dag, SolveOptions(time_limit=5, threads=1))
    later, earlier = (built.vars.ops[OpKey(OpKind.F, 1, j)] for j in (1, 0))
    built.model.add(later.end <= earlier.start)  # the last stage's F1 before its F0
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = 5
    assert solver.solve(built.model) == cp_model.INFEASIBLE
    milp = build_milp(
        problem, dag, objective_name="makespan", horizon=100.0, fractions=(1.0,), symmetry=False
    )
    assert set(runtime_chains(problem)) <= set(milp.chains)


def test_finding11_solved_offload_schedules_keep_the_rule() -> None:
    """Even from a warm start that breaks it (renumbered, then kept by the models)."""
    problem = with_copies(uniform_problem(p=2, m=4, t_comm=0.1, cap=4.0), 0.3)
    warm = overtaking_schedule(problem.replace(offload=False))
    for solver in ("cpsat", "milp"):
        result = pp_opt.solve(problem, solver=solver, time_limit=5, threads=1, warm_start=warm)
        assert validate(result.schedule) == []
        last = sorted(
            (op for op in result.schedule.ops if op.kind is OpKind.F and op.stage == 1),
            key=lambda op: op.start,
        )
        assert [op.microbatch for op in last] == list(range(problem.m))


def test_finding2_a_failing_warm_start_never_sinks_the_solve(monkeypatch) -> None:
    from pp_opt.orders import registry

    def broken(problem: Problem, **options: object) -> None:
        raise ZeroDivisionError("a bug in a generator")

    entry = dataclasses.replace(registry.REGISTRY["gpipe"], generator=broken)
    monkeypatch.setitem(registry.REGISTRY, "gpipe", entry)
    result = pp_opt.solve(uniform_problem(p=2, m=4), time_limit=3, threads=1)
    assert validate(result.schedule) == []
