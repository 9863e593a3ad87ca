"""Issue 40: a plan never loses to a point of its own space that a user would try by hand
(every placement and ``v`` with the framework's even split, every microbatch size), and it
says how many candidates its time limit left unsolved."""

from __future__ import annotations

import time
from dataclasses import replace

from plan_helpers import ScoringExecutor

import pp_opt
from pp_opt.frameworks import torchtitan as titan
from pp_opt.planner import Pins
from pp_opt.planner.config import Candidate, PlanInputs
from pp_opt.planner.problems import Bounded, bound_candidate
from pp_opt.planner.search import PRUNED_BY_TIME, solve_survivors
from pp_opt.planner.simple import SIMPLE, degrees, simple_points
from pp_opt.planner.space import enumerate_configs
from pp_opt.profiler.cards import load_hardware_card, model_card_from_dict

TINY = {"layers": 6, "hidden": 512, "heads": 8, "vocab": 2048, "seq": 512, "mlp": "swiglu",
        "norm": "rmsnorm", "attention": "flash", "bias": False, "position": "rope",
        "kv_heads": 4, "ffn": 1536}  # fmt: skip
CARD = model_card_from_dict(TINY, "tiny")
INPUTS = PlanInputs(model=CARD, hardware=load_hardware_card("h100-80gb"), gpus=4,
                    global_batch=8, seq=512)  # fmt: skip
PINS = Pins(tp=(1,), pp=(2,), ac="none", dp_shard=(1,), optimizer_sharding=False)
"""One group of degrees: tp 1, pp 2, dp 2; placements, v and microbatch sizes searched."""


def test_the_simple_points_are_every_placement_v_and_microbatch_size_with_an_even_split() -> None:
    configs = enumerate_configs(INPUTS, PINS).configs
    plain = [c for c in configs if not (c.recompute or c.offload)]
    bounded = [Bounded(candidate=replace(c, job=c.job.with_layers((3, 3))), step_bound=1.0)
               for c in plain[:1]]  # fmt: skip
    points = simple_points(INPUTS, configs, bounded, most=1)  # the first group comes whole
    shapes = {(b.candidate.job.placement, b.candidate.job.v, b.candidate.job.mbs)
              for b in points}  # fmt: skip
    assert shapes == {(c.job.placement, c.job.v, c.job.mbs) for c in plain}
    assert {(p, m) for p, _, m in shapes} == {(p, m) for p in ("loop", "v") for m in (1, 2, 4)}
    for b in points:
        job = b.candidate.job
        assert job.layers == titan.default_layers(CARD.layers, job.stages)
        assert b.candidate.origin == SIMPLE and b.infeasible is None
        assert not (b.candidate.recompute or b.candidate.offload)
        assert degrees(job) == degrees(plain[0].job)


def _recorder() -> ScoringExecutor:
    """Scores each candidate by its layer split's first stage; records the candidates."""
    return ScoringExecutor(lambda job: (100.0 + job.candidate.job.layers[0], False),
                           lambda job: job.candidate)  # fmt: skip


def test_simple_points_are_solved_first_and_once() -> None:
    config = next(c for c in enumerate_configs(INPUTS, PINS).configs
                  if not (c.recompute or c.offload))  # fmt: skip
    split = [Bounded(candidate=replace(config, job=config.job.with_layers(layers)),
                     step_bound=bound)
             for layers, bound in (((2, 4), 1.0), ((3, 3), 2.0))]  # fmt: skip
    simple = Bounded(candidate=replace(split[1].candidate, origin=SIMPLE), step_bound=2.0)
    runner = _recorder()
    found = solve_survivors(INPUTS, split, runner, short=1.0, keep=5, first=[simple],
                            deadline=time.perf_counter() + 60)  # fmt: skip
    assert [c.origin for c in runner.submitted] == [SIMPLE, "split"]  # the twin once
    assert [c.job.layers for c in runner.submitted] == [(3, 3), (2, 4)]
    assert len(found.scored) == 2
    # no time left: everything after the simple points is counted as unsolved
    runner = _recorder()
    found = solve_survivors(INPUTS, split, runner, short=1.0, keep=5, first=[simple],
                            deadline=time.perf_counter() - 1)  # fmt: skip
    assert found.pruned[PRUNED_BY_TIME] == 2


def test_the_plans_best_is_at_most_its_best_simple_point() -> None:
    """A small job with a few seconds: every simple point is solved, or its bound shows it
    cannot beat the best, and the plan's best is no slower than any of them."""
    plan = pp_opt.plan(model=CARD, hardware="h100-80gb", gpus=4, global_batch=8, pins=PINS,
                       time_limit=20)  # fmt: skip
    simple = [s for s in (*plan.candidates, *plan.failed) if s.candidate.origin == SIMPLE]
    configs = [c for c in enumerate_configs(INPUTS, PINS).configs
               if not (c.recompute or c.offload)]  # fmt: skip
    solved = {(s.job.placement, s.job.v, s.job.mbs) for s in simple}
    others = {(s.job.placement, s.job.v, s.job.mbs, s.job.layers)
              for s in (*plan.candidates, *plan.failed)}  # fmt: skip
    best = plan.best
    assert best is not None and best.step_time is not None
    for c in configs:  # solved as a simple point or a split candidate, or pruned by its bound
        even = titan.default_layers(CARD.layers, c.job.stages)
        key = (c.job.placement, c.job.v, c.job.mbs)
        if key not in solved and (*key, even) not in others:
            point = replace(c, job=c.job.with_layers(even))
            assert bound_candidate(INPUTS, point).step_bound >= best.step_time, key
    assert all(best.step_time <= s.step_time + 1e-9 for s in simple if s.step_time is not None)
    assert plan.unsolved == plan.pruned[PRUNED_BY_TIME]  # a few seconds leave some unsolved
    assert plan.to_dict()["counts"]["unsolved"] == plan.unsolved
    from pp_opt.planner.report import plan_report

    assert f"({plan.unsolved} left unsolved by the time limit)" in plan_report(plan)


def test_a_candidate_knows_its_origin() -> None:
    config = enumerate_configs(INPUTS, PINS).configs[0]
    assert Candidate(job=config.job, recompute=False, offload=False).origin == "split"
