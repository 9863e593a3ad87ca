"""A large plan keeps the configurations with the best split-free bounds, and those bounds are
lower bounds of what the full pipeline finds."""

from __future__ import annotations

from pp_opt.bounds import lower_bound
from pp_opt.planner.candidates import split_layers
from pp_opt.planner.config import Pins, PlanInputs
from pp_opt.planner.problems import candidate_problem, candidate_profile
from pp_opt.planner.screen import NO_ROOM, TOO_LARGE, _unit_key, screen, split_free_bound
from pp_opt.planner.space import enumerate_configs
from pp_opt.profiler.analytic import unit_costs
from pp_opt.profiler.cards import load_hardware_card, load_model_card

INPUTS = PlanInputs(model=load_model_card("deepseek-v3-debug"),
                    hardware=load_hardware_card("h100-80gb"), gpus=8, global_batch=32,
                    seq=2048)  # fmt: skip


def test_the_split_free_bound_is_below_every_splits_bound() -> None:
    configs = enumerate_configs(INPUTS, Pins(recompute=False, offload=False)).configs
    candidates, _ = split_layers(INPUTS, configs[:40], count=2)
    assert candidates
    for c in candidates:
        units = unit_costs(INPUTS.model, INPUTS.hardware, _unit_key(c.job))
        bound = split_free_bound(INPUTS, c.job, units)
        problem = candidate_problem(c, candidate_profile(INPUTS, c))
        assert bound is not None
        assert bound <= lower_bound(problem) * (1 + 1e-9)


def test_a_large_search_keeps_the_least_bounds_and_counts_the_rest() -> None:
    configs = enumerate_configs(INPUTS, Pins()).configs
    kept, dropped = screen(INPUTS, configs, keep=10)
    assert len(kept) == 10 and sum(dropped.values()) == len(configs) - 10
    assert set(dropped) <= {NO_ROOM, TOO_LARGE}
    bounds = {}
    for c in configs:
        b = split_free_bound(INPUTS, c.job, unit_costs(INPUTS.model, INPUTS.hardware,
                                                       _unit_key(c.job)))  # fmt: skip
        bounds[id(c)] = b
    from pp_opt.planner.screen import _bubble

    bounds = {k: (b * _bubble(next(c.job for c in configs if id(c) == k)) if b else b)
              for k, b in bounds.items()}  # fmt: skip
    worst_kept = max(bounds[id(c)] or 0.0 for c in kept)
    others = [b for c, b in ((c, bounds[id(c)]) for c in configs) if c not in kept and b]
    assert all(b >= worst_kept for b in others)
    assert screen(INPUTS, configs[:5], keep=10) == (configs[:5], {})
