"""The CP-SAT backend's phases where memory binds (issue 18).

- The proving phase (:func:`pp_opt.solvers.cpsat._prove`) asks for a schedule strictly
  better than the incumbent: with an optimal incumbent it proves it and keeps it (the same
  ops, so a proved result is as repeatable as the deterministic search).
- The fixed-order copies (:mod:`pp_opt.solvers.cpsat.fixed_order`) keep a schedule's
  compute order, never lose to the schedule they are hinted with, and give valid
  schedules on shared host links.
"""

from __future__ import annotations

import time

import pytest
from families import exact_family
from ortools.sat.python import cp_model

from pp_opt.dag import dag_for
from pp_opt.ops import OpKind, Stream
from pp_opt.orders import baseline
from pp_opt.orders.offload.offload_links import with_link_offloads
from pp_opt.orders.offload.offload_warm import raised
from pp_opt.schedule import Status
from pp_opt.solvers import solve
from pp_opt.solvers.base import SolveOptions
from pp_opt.solvers.cpsat import Found, _prove, _search
from pp_opt.solvers.cpsat.fixed_order import (
    as_schedule,
    compute_orders,
    fixed_order_model,
    order_makespan,
    promising,
)
from pp_opt.solvers.cpsat.model import build_model
from pp_opt.solvers.process.stop import running_search
from pp_opt.validator import validate


def test_the_proving_phase_proves_an_optimal_incumbent_and_keeps_it() -> None:
    """p 3, m 6, cap 2.5: 18.0 is optimal (bench_solvers.py --parts exact)."""
    problem = exact_family(3, 6, 2.5)
    best = solve(problem, time_limit=20.0)
    assert best.status == "optimal" and best.objective == pytest.approx(18.0)
    dag = dag_for(problem)
    options = SolveOptions(time_limit=20.0, threads=2, warm_start=best.schedule)
    built = build_model(problem, dag, options)
    scale = built.scaling.time
    incumbent: Found = (Status.FEASIBLE, round(18.0 * scale), None, best.schedule.ops)
    with running_search() as search:
        started = time.perf_counter()
        status, value, bound, ops = _prove(built, options, search, None, started,
                                           started + 20.0, incumbent)  # fmt: skip
    assert status == Status.OPTIMAL
    assert value == bound == round(18.0 * scale)
    assert ops is best.schedule.ops


@pytest.mark.parametrize(
    ("threads", "workers"),
    [(2, ["default_lp", "no_lp"]), (3, ["default_lp", "no_lp", "max_lp"]), (4, [])],
)
def test_the_proving_phase_refutes_with_and_without_the_lp(
    monkeypatch: pytest.MonkeyPatch, threads: int, workers: list[str]
) -> None:
    """Up to three threads the proof's workers are ``PROOF_WORKERS``, each on the whole
    model (CP-SAT's own two-thread portfolio is the LP worker and a local search that
    cannot refute); from four on, CP-SAT's portfolio. The incumbent is still proved."""
    seen: list[tuple[list[str], int, bool]] = []
    solve_model = cp_model.CpSolver.solve

    def recording(self: cp_model.CpSolver, *args: object, **kwargs: object) -> object:
        params = self.parameters
        seen.append((list(params.subsolvers), params.num_full_subsolvers,
                     params.interleave_search))  # fmt: skip
        return solve_model(self, *args, **kwargs)

    monkeypatch.setattr(cp_model.CpSolver, "solve", recording)
    problem = exact_family(3, 6, 2.5)
    warm = baseline("v-half", problem)  # 18.3; the incumbent below is the optimum, 18.0
    dag = dag_for(problem)
    options = SolveOptions(time_limit=20.0, threads=threads, warm_start=warm)
    built = build_model(problem, dag, options)
    scale = built.scaling.time
    incumbent: Found = (Status.FEASIBLE, round(18.0 * scale), None, None)
    with running_search() as search:
        started = time.perf_counter()
        status, value, _, _ = _prove(built, options, search, None, started, started + 20.0,
                                     incumbent)  # fmt: skip
    assert status == Status.OPTIMAL and value == round(18.0 * scale)
    assert seen == [(workers, len(workers), False)]


def test_the_proving_phase_finds_better_than_a_poor_incumbent() -> None:
    """An incumbent above the optimum is beaten, and the bound stays below the optimum."""
    problem = exact_family(3, 6, 2.5)
    dag = dag_for(problem)
    warm = baseline("v-half", problem)  # 18.3
    options = SolveOptions(time_limit=20.0, threads=2, warm_start=warm)
    built = build_model(problem, dag, options)
    scale = built.scaling.time
    incumbent: Found = (Status.FEASIBLE, round(warm.metrics.makespan * scale), None, warm.ops)
    with running_search() as search:
        started = time.perf_counter()
        status, value, bound, ops = _prove(built, options, search, None, started,
                                           started + 20.0, incumbent)  # fmt: skip
    assert value / scale < warm.metrics.makespan - 1e-6
    assert bound is None or bound / scale <= 18.0 + 1e-9
    schedule = as_schedule(problem, ops, warm.variant)
    assert not validate(schedule)
    assert schedule.metrics.makespan == pytest.approx(value / scale)


def test_a_search_left_without_time_proves_from_the_warm_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When the relaxation and the model take the search's share (p 4, m 12, cap 3 at 60 s
    did), the proof starts from the warm start instead of giving up; without a warm start
    the proof's workers search the rest of the time (a loaded CI machine once returned
    ``timeout`` here after 2 of its 30 s)."""
    import pp_opt.solvers.cpsat as cpsat

    monkeypatch.setattr(cpsat, "SEARCH_SHARE", 0.0)
    problem = exact_family(3, 6, 2.5)
    dag = dag_for(problem)
    warm = baseline("v-half", problem)  # 18.3; the optimum is 18.0
    result = cpsat.solve_cpsat(problem, dag, SolveOptions(time_limit=20.0, threads=2,
                                                          warm_start=warm))  # fmt: skip
    assert result.status == Status.OPTIMAL
    assert result.objective == pytest.approx(18.0) and result.bound == pytest.approx(18.0)
    schedule = as_schedule(problem, result.ops, warm.variant)
    assert not validate(schedule)
    bare = cpsat.solve_cpsat(problem, dag, SolveOptions(time_limit=20.0, threads=2))
    assert bare.status == Status.OPTIMAL and bare.seconds < 20.0
    assert bare.objective == pytest.approx(18.0) and bare.bound == pytest.approx(18.0)
    assert not validate(as_schedule(problem, bare.ops, warm.variant))


def _v_offload(cap: float):  # noqa: ANN202 - a Problem
    import dataclasses

    problem = exact_family(3, 6, cap, host_links=((0, 1),))
    stages = tuple(dataclasses.replace(st, t_offload=0.8, t_reload=0.8) for st in problem.stages)
    return problem.replace(stages=stages, offload=True)


def test_fixed_order_copies_keep_the_order_and_beat_their_hint() -> None:
    problem = _v_offload(2.0)
    source = baseline("v-half", raised(problem)[-1])  # an order made for 1.5 times the room
    greedy = with_link_offloads(problem, source)
    assert greedy is not None and not validate(greedy)
    dag = dag_for(problem, greedy.variant)
    options = SolveOptions(time_limit=4.0, threads=2, warm_start=greedy)
    built = fixed_order_model(problem, dag, options, greedy, deadline=time.perf_counter() + 4)
    with running_search() as search:
        found = _search(built, options, search, None, time.perf_counter(),
                        until=time.perf_counter() + 4.0, interleave=True)  # fmt: skip
    assert found is not None and found[3] is not None
    schedule = as_schedule(problem, found[3], greedy.variant)
    assert not validate(schedule)
    assert compute_orders(schedule) == compute_orders(greedy)
    assert schedule.metrics.makespan <= greedy.metrics.makespan + 1e-9
    # Copies cannot make an order faster than it runs without caps.
    assert schedule.metrics.makespan >= order_makespan(problem, greedy) - 1e-9
    assert any(op.kind is OpKind.OFFLOAD for op in schedule.ops)


def test_promising_orders_are_distinct_and_fastest_first() -> None:
    problem = _v_offload(2.0)
    fast = with_link_offloads(problem, baseline("v-half", raised(problem)[-1]))
    slow = with_link_offloads(problem, baseline("v-min", raised(problem)[0]))
    assert fast is not None and slow is not None
    ranked = promising(problem, [slow, fast, fast])
    assert len({repr(compute_orders(s)) for s in ranked}) == len(ranked)
    assert ranked[0] is fast or order_makespan(problem, ranked[0]) <= order_makespan(problem, fast)
    values = [order_makespan(problem, s) for s in ranked]
    assert values == sorted(values)


def test_an_offload_solve_with_other_orders_is_valid_and_no_worse() -> None:
    problem = _v_offload(2.0)
    result = solve(problem, time_limit=6.0)
    assert not validate(result.schedule)
    assert result.objective <= result.warm_start.objective + 1e-9
    copies = [op for op in result.schedule.ops if op.stream is not Stream.COMPUTE]
    assert copies, "cap 2 needs copies on this instance"


def test_checked_timing_keeps_valid_solver_times_on_shared_links() -> None:
    from pp_opt.simulator import retime
    from pp_opt.solvers.timing import checked_timing

    problem = _v_offload(2.0)
    greedy = with_link_offloads(problem, baseline("v-half", raised(problem)[-1]))
    assert greedy is not None
    kept = checked_timing(greedy)
    assert not validate(kept)
    assert kept.metrics.makespan <= retime(greedy).metrics.makespan + 1e-9
    assert kept.metrics.makespan <= greedy.metrics.makespan + 1e-9
