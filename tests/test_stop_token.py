"""A caller ends a solve early with the StopToken it passed in, keeping the best schedule;
a solve's options are frozen."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

from pp_opt import ProblemError, StopToken, load_problem, solve, validate
from pp_opt.solvers import SolveOptions
from pp_opt.solvers.process.stop import running_search

SMALL = Path(__file__).resolve().parent.parent / "examples" / "small.toml"


def test_a_token_requested_during_a_solve_ends_it_with_the_best_schedule() -> None:
    problem = load_problem(SMALL)
    token = StopToken()
    timer = threading.Timer(1.0, token.request, args=("stopped by a test",))
    started = time.perf_counter()
    timer.start()
    try:  # the span of small.toml is not proved optimal within seconds: only the token ends it
        result = solve(problem, time_limit=60, objective="span", stop=token)
    finally:
        timer.cancel()
    assert time.perf_counter() - started < 15
    assert token.requested == "stopped by a test"
    assert validate(result.schedule) == []
    assert result.warm_start is not None
    assert result.schedule.solver.objective <= result.warm_start.objective + 1e-9


def test_a_token_requested_before_the_solve_returns_the_warm_start_at_once() -> None:
    problem = load_problem(SMALL)
    token = StopToken()
    token.request("stopped before")
    token.request("a later reason is not kept")
    started = time.perf_counter()
    result = solve(problem, time_limit=60, objective="span", stop=token)
    assert time.perf_counter() - started < 15
    assert token.requested == "stopped before"
    assert validate(result.schedule) == []


def test_a_search_under_a_token_stops_when_it_is_requested() -> None:
    token = StopToken()
    stopped: list[str] = []
    with running_search(token) as search, running_search() as other:
        search.on_stop(lambda: stopped.append(search.reason or ""))
        token.request("why")
        assert search.stopped and stopped == ["why"]
        assert not other.stopped  # a search under no token is its own
    with running_search(token) as late:  # a search that starts later stops at once
        assert late.reason == "why"


def test_solve_options_are_frozen_and_a_bad_stop_is_named() -> None:
    options = SolveOptions(time_limit=5.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.time_limit = 1.0  # type: ignore[misc]
    assert dataclasses.replace(options, time_limit=1.0).time_limit == 1.0
    with pytest.raises(ProblemError, match="stop"):
        solve(load_problem(SMALL), time_limit=1, stop="now")  # type: ignore[arg-type]
