"""The large-neighbourhood search (issue 10): valid after every step, never worse, bounded."""

from __future__ import annotations

import time

import pytest

import pp_opt.solvers.entry as entry
from pp_opt.orders.registry import get
from pp_opt.problem import Problem, uniform_problem
from pp_opt.simulator import order_of, simulate
from pp_opt.solvers import solve
from pp_opt.solvers.cpsat.scaling import choose_scaling
from pp_opt.solvers.lns import SearchStats, improve
from pp_opt.solvers.lns.submodel import solve_window
from pp_opt.solvers.lns.window import cut_window
from pp_opt.validator import check_schedule, validate


def _tight_v() -> Problem:
    return uniform_problem(p=4, m=8, placement="v", v=2, t_w=0.5, m_w=0.3, t_comm=0.05, cap=3.0)


def _start() -> object:
    """A valid but poor schedule: the memory-aware greedy list schedule."""
    problem = _tight_v()
    return check_schedule(simulate(get("greedy-bfw").generator(problem)))


def test_window_parts_cover_every_op_and_respect_the_cut() -> None:
    schedule = _start()
    starts = sorted(op.start for op in schedule.ops)
    window = cut_window(schedule, starts[20], starts[80], starts[140])
    parts = [set(window.fixed), set(window.free), set(window.tail)]
    assert sum(len(p) for p in parts) == len(schedule.ops)
    assert not (parts[0] & parts[1] or parts[1] & parts[2] or parts[0] & parts[2])
    assert window.elastic <= parts[2]
    for device, own in enumerate(schedule.by_device()):
        if device not in window.cut:
            continue
        cut = window.cut[device]
        for op in own:
            if op.key in window.tail:
                assert op.start >= cut - 1e-9
            else:
                assert op.end <= cut + 1e-9


@pytest.mark.parametrize("elastic", [False, True])
def test_a_window_solution_is_a_valid_schedule(elastic: bool) -> None:
    schedule = _start()
    starts = sorted(op.start for op in schedule.ops)
    until = starts[-1] + 1 if elastic else starts[60]
    window = cut_window(schedule, starts[10], starts[60], until)
    result = solve_window(schedule, window, choose_scaling(schedule.problem),
                          waits=order_of(schedule).waits, time_limit=5, threads=2,
                          seed=0)  # fmt: skip
    assert result is not None
    assert result.objective <= schedule.metrics.makespan + 1e-9
    from pp_opt.solvers.lns.search import _accepted

    accepted = _accepted(schedule, result.ops)
    if accepted is not None:
        assert validate(accepted) == []
        assert accepted.metrics.makespan < schedule.metrics.makespan


def test_improve_never_loses_and_stays_valid() -> None:
    schedule = _start()
    stats = SearchStats()
    seen: list[float] = []
    better = improve(schedule, deadline=time.perf_counter() + 6, window_ops=60, step_limit=1.0,
                     on_improve=lambda s: seen.append(s.metrics.makespan), stats=stats)  # fmt: skip
    assert validate(better) == []
    assert better.metrics.makespan <= schedule.metrics.makespan
    assert seen == sorted(seen, reverse=True)
    assert stats.windows >= 1


@pytest.mark.timing
def test_solve_searches_large_problems_and_keeps_its_time_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(entry, "FULL_MODEL_OPS", 10)  # every problem counts as large
    problem = _tight_v()
    started = time.perf_counter()
    result = solve(problem, time_limit=4, seed=0)
    wall = time.perf_counter() - started
    assert wall <= 4 * 1.05 + 2
    assert validate(result.schedule) == []
    assert result.objective <= result.warm_start.objective + 1e-9
    assert result.schedule.solver.extra["backend_status"] == "timeout"  # full model not run


def test_rule_schedules_are_named_baselines(capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # noqa: ANN001
    from pp_opt.orders import baseline_names

    assert {"v-half", "v-min", "pipeoffload"} <= set(baseline_names())
    problem = uniform_problem(p=4, m=8, t_w=0.5, m_w=0.3, t_comm=0.05, cap=8.0)
    assert get("v-half").placements == frozenset({"v"})
    assert validate(simulate(get("v-half").generator(problem))) == []


SEARCH_ONLY = """
import sys
import pp_opt.solvers.entry as entry
from pp_opt.cli import main

entry.FULL_MODEL_OPS = 0  # straight to the large-neighbourhood search
main(sys.argv[1:])
"""


def test_a_signal_during_the_search_writes_the_best_schedule(tmp_path) -> None:  # noqa: ANN001
    """CP-SAT catches SIGINT itself unless told not to; the search's sub-solves must leave it
    to the command line, which stops the whole search and writes the best schedule."""
    import signal
    import subprocess
    import sys

    from pp_opt.cli import exit_codes

    problem = tmp_path / "tight.json"
    pp_opt_problem = uniform_problem(p=8, m=12, placement="v", v=2, t_f=18.52, t_b=18.09,
                                     t_w=9.34, m_w=0.366, t_comm=0.6, cap=4.0)  # fmt: skip
    import json

    from pp_opt.problem_io import problem_to_dict

    problem.write_text(json.dumps({"format": "pp-opt.problem", "version": 1,
                                   **problem_to_dict(pp_opt_problem)}))  # fmt: skip
    out = tmp_path / "s.json"
    run = subprocess.Popen(
        [sys.executable, "-c", SEARCH_ONLY, "solve", str(problem), "--time-limit", "120",
         "-o", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert run.stdout is not None
    line = run.stdout.readline()  # the first improvement: the search is running
    assert "incumbent" in line, line
    started = time.monotonic()
    run.send_signal(signal.SIGINT)
    _, stderr = run.communicate(timeout=60)
    assert time.monotonic() - started < 15
    assert run.returncode == exit_codes.INTERRUPTED, stderr
    assert "interrupted by SIGINT: wrote the best schedule" in stderr
    from pp_opt.schedule_io import load_schedule

    assert validate(load_schedule(out)) == []


@pytest.mark.parametrize("seed", range(4))
def test_windows_larger_than_the_schedule_wrap_around(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A schedule with fewer ops than a window, and sub-solves that never finish (so the
    window only shrinks): every wrap-around offset stays inside the schedule."""
    import pp_opt.solvers.lns.search as search

    monkeypatch.setattr(search, "solve_window", lambda *a, **k: None)
    problem = uniform_problem(p=2, m=3, t_w=0.5, m_w=0.3, cap=1.5)
    start = check_schedule(simulate(get("greedy-bfw").generator(problem)))
    stats = SearchStats()
    kept = improve(start, deadline=time.perf_counter() + 1.0, window_ops=400, seed=seed,
                   stats=stats)  # fmt: skip
    assert kept is start and stats.windows >= 2
