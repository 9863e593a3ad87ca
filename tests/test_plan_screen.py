"""A large plan keeps the configurations with the best split-free bounds, and those bounds are
lower bounds of what the full pipeline finds."""

from __future__ import annotations

import pytest

from pp_opt.bounds import lower_bound
from pp_opt.errors import ProblemError
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
    """The kept configurations have the least estimates of those some split fits and no twin
    dominates; every one left out with a lesser estimate has no split or a twin that fits
    the classic schedule's memory."""
    from pp_opt.planner.screen import DOMINATED, _bubble, _Memory, _twins

    configs = enumerate_configs(INPUTS, Pins()).configs
    kept, dropped = screen(INPUTS, configs, keep=10)
    assert len(kept) == 10 and sum(dropped.values()) == len(configs) - 10
    assert set(dropped) <= {NO_ROOM, DOMINATED, TOO_LARGE}
    estimate = {}
    for c in configs:
        b = split_free_bound(INPUTS, c.job, unit_costs(INPUTS.model, INPUTS.hardware,
                                                       _unit_key(c.job)))  # fmt: skip
        estimate[c] = None if b is None else b * _bubble(c.job)
    worst_kept = max(estimate[c] or 0.0 for c in kept)
    assert [estimate[c] for c in kept] == sorted(estimate[c] for c in kept)  # best first
    memory, present = _Memory(INPUTS), set(configs)
    modes = ("none", "selective_op", "full")
    for c in kept:
        assert memory.fits(c.job)[0] and not memory.dominated(c, modes, present)
    for c in configs:
        if c in kept or estimate[c] is None or estimate[c] >= worst_kept:
            continue
        twins = [t for t in _twins(c, modes) if t in present]
        assert not memory.fits(c.job)[0] or any(memory.fits(t.job)[1] for t in twins)
    assert screen(INPUTS, configs[:5], keep=10) == (configs[:5], {})


def test_a_twin_computes_no_more() -> None:
    from dataclasses import replace

    from pp_opt.planner.screen import _twins

    config = next(c for c in enumerate_configs(INPUTS, Pins()).configs
                  if c.job.ac == "full" and c.job.dp_shard > 1)  # fmt: skip
    config = replace(config, recompute=True)
    twins = _twins(config, ("none", "selective_op", "full"))
    plain = replace(config, recompute=False, offload=False)
    assert twins[0] == plain
    assert [t.job.ac for t in twins[1:3]] == ["none", "selective_op"]
    assert all(not (t.recompute or t.offload) for t in twins[1:])
    # torchtitan's plain data parallelism replicates the optimizer too (no ZeRO-1 there)
    assert [(t.job.dp_shard, t.job.optimizer_sharding) for t in twins[3:]] == [(1, False)]
    assert (
        _twins(
            replace(
                plain,
                job=replace(plain.job, ac="none", dp_shard=1, dp_replicate=0, fp8_all_gather=None),
            ),
            ("none",),
        )
        == []
    )


def test_the_split_models_memory_is_the_profilers_static_memory() -> None:
    """The split model's memory rows (no activation in flight) are each device's static
    bytes as the profiler counts them (FSDP's held weights and gradients, receive buffers,
    the output logits): exact on the even split it is written from; on others within 10%
    (it counts an MoE model's dense layers as MoE layers)."""
    from pp_opt.planner.candidates import config_split_model, even_split
    from pp_opt.planner.split import MEMORY_SCALE
    from pp_opt.profiler.analytic import stage_costs, static_bytes

    card, hw = INPUTS.model, INPUTS.hardware
    configs = [c for c in enumerate_configs(INPUTS, Pins()).configs
               if c.job.stages > 1 and not (c.recompute or c.offload)]  # fmt: skip
    assert any(c.job.dp_shard > 1 for c in configs)
    for config in configs[::7]:
        model = config_split_model(INPUTS, config.job)
        stages = config.job.stages
        for split in (even_split(card.layers, stages),
                      (1,) * (stages - 1) + (card.layers - stages + 1,)):  # fmt: skip
            job = config.job.with_layers(split)
            try:
                real = static_bytes(card, stage_costs(card, hw, job), job, hw)
            except ProblemError:
                continue
            mine = model.memory(split, (0,) * model.stages)
            slack = stages * MEMORY_SCALE  # rounding up to MiB per stage
            for d, got in enumerate(real):
                assert mine[d] * MEMORY_SCALE == pytest.approx(got, rel=0.1, abs=slack)
                if split == even_split(card.layers, stages):
                    assert mine[d] * MEMORY_SCALE == pytest.approx(got, abs=slack)


def test_prepare_stops_splitting_at_its_deadline_and_counts_the_rest() -> None:
    import time

    from pp_opt.planner.pipeline import prepare
    from pp_opt.planner.search import NOT_PREPARED

    pins = Pins(tp=(1,), pp=(2,), ac="none", dp_shard=(4,), mbs=(1,))  # torchtitan: EP in FSDP
    configs = enumerate_configs(INPUTS, pins).configs
    _, bounded, pruned, waiting = prepare(INPUTS, pins)
    assert bounded and NOT_PREPARED not in pruned and waiting == []
    _, none, late, waiting = prepare(INPUTS, pins, deadline=time.perf_counter() - 1)
    assert none == [] and late[NOT_PREPARED] == len(configs)
    assert sorted(c.key() for c in waiting) == sorted(c.key() for c in configs)  # for later


def test_the_memory_time_bound_holds_where_the_activations_barely_fit() -> None:
    """Llama 3.1 405B on 512 GPUs at tp8 pp4 (16 microbatches, the optimizer sharded, no
    checkpointing): the devices' room holds about one microbatch's activations, so Little's
    law over all devices bounds the makespan above the busiest device's work; the bound
    stays below every split's (:func:`pp_opt.lower_bound`, whose memory terms are per
    device and per stage)."""
    from pp_opt.planner.screen import memory_time_bound

    inputs = PlanInputs(model=load_model_card("llama3.1-405b"),
                        hardware=load_hardware_card("h100-96gb-500w"), gpus=512,
                        global_batch=256, seq=8192)  # fmt: skip
    pins = Pins(recompute=False, offload=False, tp=8, pp=4, mbs=1, ac="none", fp8=True,
                compile=True, async_tp=True, optimizer_sharding=True, placement="loop")  # fmt: skip
    configs = [c for c in enumerate_configs(inputs, pins).configs if c.job.v in (2, 4, 11)]
    candidates, _ = split_layers(inputs, configs, count=1)
    assert len(candidates) == 3
    for c in candidates:
        units = unit_costs(inputs.model, inputs.hardware, _unit_key(c.job))
        work = split_free_bound(inputs, c.job, units)
        memory = memory_time_bound(inputs, c.job, units)
        problem = candidate_problem(c, candidate_profile(inputs, c))
        assert work is not None and memory > work
        assert memory <= lower_bound(problem) * (1 + 1e-9)


def test_candidates_left_unbounded_wait_for_a_search_with_time_left() -> None:
    """Split candidates with recompute or offload are bounded after the others; those the
    deadline leaves are returned with the unsplit configurations, and a later preparation
    bounds them without splitting them again."""
    import time
    from collections import Counter

    from pp_opt.planner.pipeline import prepare, prepare_configs
    from pp_opt.planner.search import NOT_PREPARED

    pins = Pins(tp=(1,), pp=(2,), ac="none", dp_shard=(4,), mbs=(1,))  # torchtitan: EP in FSDP
    _, everything, _, _ = prepare(INPUTS, pins)
    variants = [b.candidate for b in everything if b.candidate.recompute or b.candidate.offload]
    assert variants and all(c.job.layers for c in variants)
    late: Counter[str] = Counter()
    none, waiting = prepare_configs(INPUTS, variants, late, splits=2,
                                    deadline=time.perf_counter() - 1)  # fmt: skip
    assert none == [] and waiting == variants and late[NOT_PREPARED] == len(variants)
    again, left = prepare_configs(INPUTS, waiting, Counter(), splits=2, deadline=None)
    assert left == [] and [b.candidate for b in again] == variants
