"""The memory-aware list schedules under tight caps."""

from __future__ import annotations

import pytest

from pp_opt.errors import PPOptError
from pp_opt.orders import candidates
from pp_opt.orders.registry import get
from pp_opt.problem import Problem, uniform_problem
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


def _deep_loop() -> Problem:
    """Llama 3.1 405B on 512 H100 96 GB, tp8 pp4 dp16, 44 stages of 2-3 layers, 16
    microbatches, the optimizer sharded, no checkpointing: a device holds 11 stages and its
    room is about 13 of their activations, so about one microbatch fits at a time."""
    from pp_opt.job import Job
    from pp_opt.planner.candidates import even_split
    from pp_opt.profiler.analytic import profile_analytic
    from pp_opt.profiler.cards import load_hardware_card, load_model_card
    from pp_opt.profiler.costs import problem_from_profile
    from pp_opt.profiler.layer_split import job_for_card

    card = load_model_card("llama3.1-405b")
    job = Job(
        pp=4,
        tp=8,
        dp_replicate=16,
        v=11,
        placement="loop",
        mbs=1,
        microbatches=16,
        seq=8192,
        optimizer_sharding=True,
        fp8=True,
        compile=True,
        async_tp=True,
    )
    job = job.with_layers(even_split(card.layers, job.stages))
    profile = profile_analytic(card, load_hardware_card("h100-96gb-500w"), job_for_card(card, job))
    return problem_from_profile(profile)


def test_room_for_older_microbatches_overlaps_them_in_a_deep_pipeline() -> None:
    """Reserving each forward's later chunks (greedy-bfw's rule when it gets stuck) runs one
    microbatch after another; keeping room only for what older microbatches still allocate
    lets the next one's forwards run beside the older one's backwards."""
    from pp_opt.bounds import lower_bound

    problem = _deep_loop()
    older = check_schedule(simulate(get("greedy-bfw-older-first").generator(problem)))
    greedy = check_schedule(simulate(get("greedy-bfw").generator(problem)))
    assert older.objective_value() < 0.7 * greedy.objective_value()
    assert older.objective_value() < 1.4 * lower_bound(problem)
    assert candidates(problem)[0].name == "greedy-bfw-older-first"


@pytest.mark.parametrize("seed", range(12))
def test_room_for_older_microbatches_never_gets_stuck(seed: int) -> None:
    """Under any cap that holds one microbatch's activations on every device, the oldest
    microbatch in flight can always go on: the rule never deadlocks, and its schedule is
    valid (dependencies, one op per stream, the caps)."""
    import random

    from pp_opt.placement import stage_devices
    from pp_opt.problem import Device, Stage

    rng = random.Random(seed)
    p, v = rng.randint(2, 4), rng.randint(1, 3)
    placement = rng.choice(["loop", "v"]) if v == 2 else "loop"
    stages = tuple(Stage(device=d, t_f=rng.uniform(0.5, 1.5), t_b=rng.uniform(0.5, 2.0),
                         t_w=rng.uniform(0.2, 1.0), m_b=rng.uniform(0.5, 2.0),
                         m_w=rng.uniform(0.0, 0.5))  # fmt: skip
                   for d in stage_devices(placement, p, v))  # fmt: skip
    one = max(sum(s.m_b for s in stages if s.device == d) for d in range(p))
    cap = one * rng.uniform(1.0, 2.5)
    problem = Problem(p=p, m=rng.randint(2, 8), stages=stages, placement=placement,
                      devices=tuple(Device(cap=cap, static=0.0) for _ in range(p)),
                      t_comm=rng.uniform(0.0, 0.1))  # fmt: skip
    check_schedule(simulate(get("greedy-bfw-older-first").generator(problem)))


@pytest.mark.parametrize("name", ["greedy-bfw", "greedy-lazy-w", "greedy-bfw-older-first"])
def test_a_forward_that_keeps_nothing_leaves_the_list_schedules_working(name: str) -> None:
    """A chunk may keep no activation (``m_b = 0``); the rules still give valid orders."""
    from pp_opt.placement import stage_devices
    from pp_opt.problem import Device, Stage

    stages = tuple(Stage(device=d, t_f=1.0, t_b=1.0, t_w=0.5, m_b=0.0 if s % 2 else 1.0)
                   for s, d in enumerate(stage_devices("loop", 2, 2)))  # fmt: skip
    problem = Problem(p=2, m=4, stages=stages, placement="loop",
                      devices=(Device(cap=2.0, static=0.0),) * 2)  # fmt: skip
    check_schedule(simulate(get(name).generator(problem)))
