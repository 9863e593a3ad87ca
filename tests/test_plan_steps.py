"""The planner's steps one at a time, against closed forms and brute force."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from test_plan import TINY as TINY_CARD

from pp_opt.job import Job
from pp_opt.planner.baselines import baseline_candidates
from pp_opt.planner.candidates import config_splits
from pp_opt.planner.config import Candidate, Pins, PlanInputs
from pp_opt.planner.space import enumerate_configs
from pp_opt.planner.split import best_split, in_flight, memory_levels, split_model
from pp_opt.planner.step import dp_sync_bound, dp_sync_ms, step_time
from pp_opt.profiler import load_hardware_card, load_model_card, profile_costs
from pp_opt.profiler.analytic import bytes_per_param, stage_costs, tp_comm_ms, unit_costs
from pp_opt.profiler.cards import model_card_from_dict
from pp_opt.profiler.comm import ring_all_reduce_ms
from pp_opt.profiler.layer_split import job_for_card
from pp_opt.profiler.step_terms import (
    fsdp_exposed_ms,
    model_flops_per_sequence,
    optimizer_ms,
    stage_all_reduce_ms,
)

H100 = load_hardware_card("h100-80gb")
TINY = model_card_from_dict(TINY_CARD, "tiny")


def _inputs(gpus: int = 8, batch: int = 16, card=TINY) -> PlanInputs:
    return PlanInputs(model=card, hardware=H100, gpus=gpus, global_batch=batch, seq=card.seq)


def _config(**over: object) -> Job:
    values: dict[str, object] = dict(
        tp=1,
        pp=2,
        dp=1,
        v=1,
        placement="loop",
        mbs=1,
        microbatches=8,
        seq=TINY.seq,
        optimizer_sharding=False,
    )
    values.update(over)
    return Job(**values)  # type: ignore[arg-type]


def _candidate(**over: object) -> Candidate:
    return Candidate(job=_config(**over), recompute=False, offload=False)


# --- enumeration ---------------------------------------------------------------------------


def test_every_configuration_divides_the_job() -> None:
    found = enumerate_configs(_inputs(gpus=8, batch=16), Pins())
    # 6 layers: pp = 8 has too few, and so has the v placement on 4 devices
    assert found.configs and found.skipped == {
        "tp does not divide the heads": 1,
        "pp above the layers": 1,
        "pp * v above the layers": 9,
    }
    for c in (candidate.job for candidate in found.configs):
        assert c.tp * c.pp * c.dp == 8 and c.dp * c.mbs * c.m == 16
        assert c.pp * c.v <= TINY.layers and TINY.heads % c.tp == 0
        assert (c.placement == "v") == (c.v == 2 and c.placement == "v")
        assert not (c.optimizer_sharding and c.dp == 1)
    assert len(set(found.configs)) == len(found.configs)


def test_the_count_follows_from_the_legal_values() -> None:
    # tp in {1, 2, 4} (kv_heads 4), pp = 1 with dp = 4/tp; pinned mbs 1, v 1, loop, no switches
    pins = Pins(pp=(1,), mbs=(1,), v=(1,), placement=("loop",), recompute=False, offload=False)
    found = enumerate_configs(_inputs(gpus=4, batch=8), pins)
    # tp 1: dp 4 (replicated, or FSDP over the 4), tp 2: dp 2 (the same over 2), tp 4: dp 1;
    # each under torchtitan's three checkpointing modes. torchtitan has no sharded optimizer
    # beside replicated weights, so the plan does not search one on its stack.
    layouts = [(1, 4, 1, False), (1, 4, 4, False), (2, 2, 1, False), (2, 2, 2, False),
               (4, 1, 1, False)]  # fmt: skip
    got = [(c.job.tp, c.job.dp, c.job.dp_shard, c.job.optimizer_sharding, c.job.ac)
           for c in found.configs]  # fmt: skip
    assert len(got) == 15 and sorted(got) == sorted(
        (*layout, ac) for layout in layouts for ac in ("none", "selective_op", "full")
    )
    assert found.skipped == {"tp does not divide gpus": 1}  # tp 8 of the node's divisors
    narrow = Pins(pp=(1,), mbs=(1,), v=(1,), placement=("loop",), recompute=False,
                  offload=False, ac="none", dp_shard=(1,))  # fmt: skip
    old = [(c.job.tp, c.job.dp, c.job.optimizer_sharding)
           for c in enumerate_configs(_inputs(gpus=4, batch=8), narrow).configs]  # fmt: skip
    assert old == [(1, 4, False), (2, 2, False), (4, 1, False)]
    same = dict(pp=(1,), mbs=(1,), v=(1,), placement=("loop",), recompute=False, offload=False)
    pinned = Pins(**same, ac="none", dp_shard=(1,), optimizer_sharding=True)  # a pin gets it
    assert [c.job.optimizer_sharding for c in enumerate_configs(
        _inputs(gpus=4, batch=8), pinned).configs] == [True, True, False]  # fmt: skip
    megatron = Pins(**same, ac="none", stack="megatron-core")
    zero = {(c.job.tp, c.job.dp, c.job.optimizer_sharding)
            for c in enumerate_configs(_inputs(gpus=4, batch=8), megatron).configs}  # fmt: skip
    assert zero == {(1, 4, False), (1, 4, True), (2, 2, False), (2, 2, True), (4, 1, False)}


def test_the_stack_names_the_checkpointing_modes_a_plan_searches() -> None:
    pins = Pins(tp=(1,), pp=(2,), mbs=(1,), v=(1,), placement=("loop",), recompute=False,
                offload=False, optimizer_sharding=False)  # fmt: skip
    found = enumerate_configs(_inputs(gpus=4, batch=8), pins)
    assert [(c.job.ac, c.job.dp_shard) for c in found.configs] == [
        ("none", 1), ("selective_op", 1), ("full", 1),
        ("none", 2), ("selective_op", 2), ("full", 2),
    ]  # fmt: skip
    megatron = Pins(tp=(1,), pp=(2,), mbs=(1,), v=(1,), placement=("loop",), recompute=False,
                    offload=False, optimizer_sharding=False, stack="megatron-core")  # fmt: skip
    found = enumerate_configs(_inputs(gpus=4, batch=8), megatron)
    # its distributed optimizer shards the state: no FSDP degree to search
    assert [(c.job.ac, c.job.dp_shard) for c in found.configs] == [
        ("none", 1), ("selective", 1), ("full", 1),
    ]  # fmt: skip


def test_data_parallel_ranks_across_nodes_also_try_hsdp_within_a_node() -> None:
    """32 GPUs, 8 per node: tp 1 leaves dp 32, whose FSDP can shard over a node's 8 ranks
    (4 replicas, HSDP) as well as over all 32; tp 2 shards over 4; tp 8 fills the node, so
    its shard group of one is plain data parallelism."""
    pins = Pins(pp=(1,), mbs=(1,), v=(1,), placement=("loop",), recompute=False,
                offload=False, ac="none")  # fmt: skip
    found = enumerate_configs(_inputs(gpus=32, batch=32), pins)
    shards: dict[int, set[tuple[int, int]]] = {}
    for c in found.configs:
        shards.setdefault(c.job.tp, set()).add((c.job.dp_shard, c.job.dp_replicate))
    assert shards[1] == {(1, 32), (8, 4), (32, 1)}
    assert shards[2] == {(1, 16), (4, 4), (16, 1)}
    assert shards[4] == {(1, 8), (2, 4), (8, 1)}
    assert 8 not in shards or shards[8] == {(1, 4), (4, 1)}
    pinned = Pins(pp=(1,), mbs=(1,), v=(1,), placement=("loop",), recompute=False,
                  offload=False, ac="none", dp_shard=(32,))  # fmt: skip
    assert {c.job.dp_shard for c in enumerate_configs(_inputs(gpus=32, batch=32),
                                                       pinned).configs} == {32}  # fmt: skip


@pytest.mark.parametrize("stack", ["torchtitan", "automodel"])
def test_torchtitan_experts_borrow_only_the_shard_group(stack: str) -> None:
    """torchtitan's expert parallelism borrows ranks from ``dp_shard x cp x tp`` (efsdp x ep),
    so its HSDP and plain data-parallel layouts take only the ``ep`` their shard group holds;
    AutoModel's borrow every data-parallel rank but run no experts under plain data
    parallelism (its FSDP2 refuses pure replication, its DDP strategy expert parallelism)."""
    card = load_model_card("deepseek-v3-debug")  # 8 experts
    pins = Pins(tp=(1,), pp=(1,), mbs=(1,), v=(1,), placement=("loop",), recompute=False,
                offload=False, ac="none", stack=stack)  # fmt: skip
    found = enumerate_configs(_inputs(gpus=32, batch=32, card=card), pins)
    eps: dict[int, set[int]] = {}
    for c in found.configs:
        eps.setdefault(c.job.dp_shard, set()).add(c.job.ep)
    if stack == "torchtitan":
        assert eps == {8: {2, 4, 8}, 32: {2, 4, 8}}  # one shard: nothing to borrow
        assert found.skipped["ep x etp does not divide the ranks experts borrow"] == 3
    else:
        assert eps == {8: {2, 4, 8}, 32: {2, 4, 8}}
        why = "the stack runs no expert parallelism under plain data parallelism"
        assert found.skipped[why] == 1
    # a pinned ep too wide for a node's shard group: counted for each group it misses (the
    # plain one and the node's), not once per data-parallel degree
    wide = Pins(tp=(1,), pp=(1,), mbs=(1,), v=(1,), placement=("loop",), recompute=False,
                offload=False, ac="none", stack=stack, ep=(16,))  # fmt: skip
    got = enumerate_configs(_inputs(gpus=32, batch=32, card=load_model_card("deepseek-v3")),
                            wide)  # fmt: skip
    assert {c.job.dp_shard for c in got.configs} == ({32} if stack == "torchtitan"
                                                      else {8, 32})  # fmt: skip
    assert got.skipped["ep x etp does not divide the ranks experts borrow"] == (
        2 if stack == "torchtitan" else 0
    )


def test_pinned_values_that_do_not_divide_are_skipped_and_counted() -> None:
    pins = Pins(
        tp=(1, 3),
        pp=(3, 2),
        mbs=(3, 1),
        v=(1,),
        placement=("loop",),
        recompute=False,
        offload=False,
        optimizer_sharding=False,
    )
    found = enumerate_configs(_inputs(gpus=4, batch=8), pins)
    # one layout, under 3 checkpointing modes x (plain, FSDP over the 2); each skip counted
    # once, not once per FSDP degree
    assert {(c.job.pp, c.job.mbs, c.job.m, c.job.dp) for c in found.configs} == {(2, 1, 4, 2)}
    assert len(found.configs) == 6
    assert found.skipped == {
        "tp does not divide gpus_per_node (8)": 1,
        "tp * pp does not divide gpus": 1,
        "dp * mbs does not divide global_batch": 1,
    }


# --- static memory, per-layer costs ----------------------------------------------------------


def test_static_bytes_follow_the_optimizer_sharding() -> None:
    assert bytes_per_param() == 16.0
    assert bytes_per_param(dp=4, optimizer_sharding=True) == 2 + 2 + 12 / 4
    assert bytes_per_param(dp=4, optimizer_sharding=False) == 16.0


def test_unit_costs_add_up_to_the_stage_costs() -> None:
    card = load_model_card("llama3-8b")
    layout = job_for_card(card, Job(pp=4, microbatches=8, seq=4096, tp=2, layers=(7, 9, 9, 7)))
    units = unit_costs(card, H100, layout)
    for st in stage_costs(card, H100, layout):
        for key in ("t_f", "t_b", "t_w", "m_b", "m_w", "params"):
            want = st.layers * units.layer[key]
            want += units.embedding[key] if st.embedding else 0.0
            want += units.head[key] if st.head else 0.0
            assert getattr(st, key) == pytest.approx(want, rel=1e-12)


def test_tensor_parallel_collectives_are_in_unless_hidden() -> None:
    plain = profile_costs(model="llama3-8b", hardware=H100, pp=2, tp=2, microbatches=4,
                          tp_comm=False)  # fmt: skip
    comm = profile_costs(model="llama3-8b", hardware=H100, pp=2, tp=2, microbatches=4)
    assert "tp_comm" not in plain["profile"] and comm["profile"]["tp_comm"] is True
    layout = Job(pp=2, tp=2, microbatches=4, seq=8192)
    # 4 ring collectives of (t-1)/t of s*b*h bf16 at 450 GB/s, one 10 us latency each
    one = 0.5 * 2 * 8192 * 4096 / 450e9 + 10e-6
    assert tp_comm_ms(load_model_card("llama3-8b"), H100, layout) == pytest.approx(4e3 * one)
    for a, b in zip(plain["stages"], comm["stages"], strict=True):
        assert b["t_f"] - a["t_f"] == pytest.approx(16 * 4e3 * one)
        assert b["t_w"] == a["t_w"]


# --- layer split ------------------------------------------------------------------------------


def _model(config: Job, card=TINY, cap: float | None = None):
    units = unit_costs(card, H100, config)
    return split_model(
        config,
        units,
        layers=card.layers,
        bytes_per_param=16.0,
        cap=H100.cap_bytes if cap is None else cap,
        t_comm=0.01,
    )


def _compositions(total: int, parts: int):
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(parts))


@pytest.mark.parametrize(
    ("pp", "v", "placement"), [(2, 1, "loop"), (3, 1, "loop"), (2, 2, "loop"), (2, 2, "v")]
)
def test_the_split_model_finds_the_brute_force_optimum(pp: int, v: int, placement: str) -> None:
    model = _model(_config(pp=pp, v=v, placement=placement, microbatches=6))
    for k in memory_levels(model):
        feasible = [s for s in _compositions(TINY.layers, pp * v) if model.fits(s, k)]
        best = best_split(model, k)
        assert best is not None and model.fits(best, k)
        assert model.score(best, k) == min(model.score(s, k) for s in feasible)


def test_a_tight_cap_moves_layers_off_the_stages_that_keep_most_in_flight() -> None:
    card = load_model_card("llama3-8b")
    config = _config(pp=4, microbatches=16, seq=card.seq, stack="torchtitan-2412")  # DDP state
    tight = _model(config, card=card)
    # 1F1B keeps 4 microbatches on device 0: 9 layers there (with the static memory of the
    # embedding) do not fit 76 GiB, 9 on device 1 (3 in flight) do
    assert tight.k == (4, 3, 2, 1)
    assert not tight.fits((9, 8, 8, 7), tight.k) and tight.fits((8, 9, 8, 7), tight.k)
    assert best_split(tight, tight.k) == (8, 9, 9, 6)
    # the output layer (with its loss) weighs about 2.5 Llama layers (elementwise passes by
    # kernels.elementwise_bytes): 8 layers with it are the slowest device
    assert tight.proxy((8, 8, 8, 8)) > tight.proxy((8, 9, 9, 6))
    assert config_splits(_inputs(card=card), config, count=1) == [(8, 9, 9, 6)]


def test_nothing_fits_no_split() -> None:
    model = _model(_config(pp=2), cap=1.0)
    assert all(best_split(model, k) is None for k in memory_levels(model))


def test_in_flight_counts_of_the_classic_schedules() -> None:
    assert in_flight("loop", 4, 1, 16) == [4, 3, 2, 1]  # 1F1B
    assert in_flight("loop", 4, 1, 2) == [2, 2, 2, 1]  # at most m
    assert in_flight("v", 4, 2, 16) == [7, 5, 3, 1, 7, 5, 3, 1]  # the V shape: 2p per device
    # interleaved: device d warms up 2(p-d-1) + (v-1)p chunks, plus one
    assert in_flight("loop", 4, 2, 16)[:4] == [math.ceil(11 / 2), 5, math.ceil(7 / 2), 3]


def test_torchtitan_and_megatron_splits() -> None:
    found = baseline_candidates(_candidate(pp=4), 32)
    names = [(label, order, c.job.v, c.job.layers) for label, order, c in found]
    assert names == [
        ("torchtitan", "1F1B", 1, (8, 9, 8, 7)),
        ("torchtitan", "Interleaved1F1B", 2, (4, 5, 4, 4, 4, 4, 4, 3)),
        ("megatron", "Interleaved1F1B", 2, (4,) * 8),
    ]
    uneven = [(label, c.job.layers) for label, _, c in baseline_candidates(_candidate(pp=4), 22)]
    assert uneven == [("torchtitan", (5, 6, 6, 5)), ("torchtitan", (2, 3, 3, 3, 3, 3, 3, 2))]


# --- step time ---------------------------------------------------------------------------------


def test_ring_all_reduce_closed_form() -> None:
    assert ring_all_reduce_ms(1e9, 1, 100.0, 10.0) == 0.0
    # 2 (n-1)/n of the bytes each way, 2 (n-1) latencies
    assert ring_all_reduce_ms(1e9, 4, 100.0, 10.0) == pytest.approx(1e3 * 1.5 * 1e9 / 100e9 + 0.06)


def test_dp_sync_hides_behind_the_cool_down() -> None:
    devices = [0, 1, 0, 1]  # loop, p = 2, v = 2
    ready = [100.0, 90.0, 95.0, 80.0]
    # device 0 reduces stage 2 (ready 95) until 105, then stage 0 (ready 100) until 115
    # device 1: stage 3 at 80 -> 90, stage 1 at 90 -> 100: hidden
    assert dp_sync_ms(ready, devices, [10.0] * 4, 100.0) == pytest.approx(15.0)
    assert dp_sync_ms(ready, devices, [1.0] * 4, 100.0) == pytest.approx(1.0)
    assert dp_sync_ms(ready, devices, [0.0] * 4, 100.0) == 0.0
    assert dp_sync_bound([3.0, 2.0]) == 2.0


def test_step_time_and_its_rates() -> None:
    inputs = _inputs(gpus=4, batch=8)
    config = _config(pp=2, dp=2, microbatches=4)
    figures = step_time(inputs, config, makespan=100.0, dp_sync=5.0, optimizer_step=2.0)
    assert figures.step_time == 107.0
    assert figures.tokens_per_s_per_gpu == pytest.approx(8 * 512 / 0.107 / 4)
    flops = 8 * model_flops_per_sequence(inputs.model, inputs.seq)
    assert figures.mfu == pytest.approx(flops / (0.107 * 4 * H100.peak_flops))
    # 6 N per token (the layers' matrices and the output layer), plus attention's QK^T and
    # PV: 4 s h per token and layer forward, three times that with the backward
    h, f, kv, s = 512, 1536, 256, 512
    n = TINY.layers * (h * (h + 2 * kv) + h * h + 3 * h * f) + h * 2048
    attention = 3 * 4 * s * h * TINY.layers
    assert model_flops_per_sequence(inputs.model, inputs.seq) == pytest.approx(
        s * (6 * n + attention)
    )
    sharded = optimizer_ms(_config(dp=2, optimizer_sharding=True), inputs.hardware, [1e9])
    assert sharded == pytest.approx(optimizer_ms(_config(dp=2), inputs.hardware, [1e9]) / 2)


def test_routed_experts_reduce_and_update_over_their_own_data_parallel_group() -> None:
    """dp 8, ep 4: experts have 2 data-parallel replicas (edp), the dense part 8; with
    ep = dp the experts are not reduced at all and their optimizer state is not sharded."""
    link = H100.intra_node_gbs, H100.intra_node_latency_us  # 8 GPUs: one node
    moe = _config(pp=1, dp=8, ep=4, optimizer_sharding=True)
    dense, experts = 2e8, 6e8
    (reduce,) = stage_all_reduce_ms(moe, H100, [dense + experts], [experts])
    assert reduce == pytest.approx(
        ring_all_reduce_ms(2 * dense, 8, *link) + ring_all_reduce_ms(2 * experts, 2, *link)
    )
    ddp = _config(pp=1, dp=8, ep=8, stack="torchtitan-2412")  # 0.3.0 would run FSDP2
    (whole,) = stage_all_reduce_ms(ddp, H100, [dense + experts], [experts])
    assert whole == pytest.approx(ring_all_reduce_ms(2 * dense, 8, *link))
    updated = optimizer_ms(moe, H100, [dense + experts], [experts])
    assert updated == pytest.approx(optimizer_ms(moe, H100, [dense + 4 * experts]))  # 1/8, 1/2


def test_one_shard_fsdp_all_reduces_over_the_replicas_in_each_backward() -> None:
    """torchtitan 0.3.0 runs plain data parallelism as FSDP2 with one shard (HSDP over the
    replicas): without a pipeline each layer's fp32 gradients are all-reduced in its backward,
    exposed where the backward is shorter (here: no compute at all)."""
    link = H100.intra_node_gbs, H100.intra_node_latency_us
    plain = _config(pp=1, dp=8, microbatches=2)
    assert (plain.dp_shard, plain.dp_replicate) == (1, 8)
    layer = {"t_f": 0.0, "t_b": 0.0, "t_w": 0.0, "params": 1e8}
    exposed = fsdp_exposed_ms(plain, TINY, H100, layer, root_params=3e7)
    per_layer = ring_all_reduce_ms(4 * 1e8, 8, *link)
    assert exposed == pytest.approx(ring_all_reduce_ms(4 * 3e7, 8, *link) + TINY.layers * per_layer)
    ddp = _config(pp=1, dp=8, microbatches=2, stack="torchtitan-2412")  # the benchmark's DDP
    assert fsdp_exposed_ms(ddp, TINY, H100, layer, root_params=3e7) == 0.0


# --- ranking -------------------------------------------------------------------------------


def test_equal_step_times_rank_by_what_the_candidate_fixes_not_by_the_schedule_found() -> None:
    """Two optimal schedules of one problem may peak differently; the ranking must not depend
    on which one a solve returned (it differed between a Ray and a pool run under load)."""
    from pp_opt.planner.evaluate import Scored

    def scored(layers: tuple[int, ...], peak: float, static: float, step: float = 0.8636) -> Scored:
        candidate = _candidate(layers=layers, v=2, placement="v", microbatches=4)
        return Scored(candidate=candidate, order="solve", status="optimal", step_time=step,
                      peak_memory=[peak, 1.0], static_memory=static)  # fmt: skip

    a, b = (2, 2, 1, 1), (2, 1, 2, 1)
    first = sorted([scored(a, 301.7e6, 100e6), scored(b, 305.9e6, 100e6)], key=Scored.sort_key)
    again = sorted([scored(a, 305.9e6, 100e6), scored(b, 301.7e6, 100e6)], key=Scored.sort_key)
    assert [s.layers for s in first] == [s.layers for s in again] == [b, a]  # the fixed order
    leaner = sorted([scored(b, 1e6, 120e6), scored(a, 9e9, 100e6)], key=Scored.sort_key)
    assert [s.layers for s in leaner] == [a, b]  # less static memory first
    faster = sorted([scored(b, 1e6, 100e6), scored(a, 1e6, 1e6, step=0.9)], key=Scored.sort_key)
    assert [s.layers for s in faster] == [b, a]  # step time before all
    failed = Scored(candidate=_candidate(layers=a, v=2, placement="v"), order="solve",
                    status="timeout")  # fmt: skip
    assert sorted([failed, first[0]], key=Scored.sort_key)[-1] is failed


def test_the_memory_test_agrees_with_the_split_model() -> None:
    """:func:`memory_fits` answers, without a solve, whether the split model finds a split at
    a level; on random models the two agree at every level (and the aggregate test never
    rejects a model the split model solves)."""
    import random

    from pp_opt.planner.split import (
        SplitModel,
        best_split,
        fits_in_total,
        memory_fits,
        memory_levels,
    )

    rng = random.Random(3)
    seen = {True: 0, False: 0}
    for _ in range(60):
        p, v = rng.choice([(2, 1), (3, 1), (2, 2), (4, 2)])
        devices = tuple(s % p for s in range(p * v))
        layers = rng.randint(p * v, 4 * p * v)
        unit = (rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 40),
                rng.randint(0, 40))  # fmt: skip
        ends = tuple(rng.randint(0, 30) for _ in range(5))
        model = SplitModel(layers=layers, devices=devices, m=4, layer=unit, first=ends,
                           last=ends, t_comm=1, room=rng.randint(50, 600),
                           k=tuple(rng.randint(1, 4) for _ in devices))  # fmt: skip
        for k in memory_levels(model):
            found = best_split(model, k) is not None
            assert memory_fits(model, k) == found
            assert fits_in_total(model) or not found
            seen[found] += 1
    assert seen[True] and seen[False]


def test_no_split_is_solved_for_when_the_devices_together_cannot_hold_the_layers() -> None:

    from pp_opt.planner.split import fits_in_total, split_candidates

    roomy = _model(_config(pp=2, microbatches=6))
    need = sum(n * (u[3] + u[4]) for n, u in ((TINY.layers, roomy.layer), (1, roomy.first),
                                              (1, roomy.last)))  # fmt: skip
    assert fits_in_total(roomy) and split_candidates(roomy)
    edge = replace(roomy, room=-(-need // 2))  # two devices hold it all, one activation each
    assert fits_in_total(edge)
    tight = replace(roomy, room=-(-need // 2) - 1)
    assert not fits_in_total(tight) and split_candidates(tight) == []
    ones = (1,) * tight.stages  # the brute force agrees: not even one activation per stage fits
    assert not any(tight.fits(s, ones) for s in _compositions(TINY.layers, tight.stages))


def test_refinement_first_gives_ten_seconds_to_more_candidates() -> None:
    """With 101 s left on one worker, a first round solves the 5 best (half the time, 10 s
    each); the fifth improves most, and the second round gives the rest of the time to the
    3 best after the first. With too little time for a wide round, the 3 best alone."""
    import time

    from pp_opt.job import Job
    from pp_opt.planner.config import Candidate
    from pp_opt.planner.evaluate import Scored
    from pp_opt.planner.search import SearchResult, refine

    def scored(v: int, step: float) -> Scored:
        job = Job(pp=2, v=v, microbatches=4, seq=1024)
        return Scored(candidate=Candidate(job=job, recompute=False, offload=False),
                      order="solve", status="feasible", iteration_makespan=step,
                      step_time=step, lower_bound=0.9 * step, gap=0.1)  # fmt: skip

    class Refining:
        """Each solve takes 1 ms off a candidate's step time, 30 ms off v 5's first."""

        workers = 1

        def __init__(self) -> None:
            self.submitted: list[tuple[int, float]] = []
            self.done: list[Scored] = []
            self.steps = {v: 100.0 + v for v in range(1, 9)}

        def submit(self, task) -> None:  # type: ignore[no-untyped-def]
            v = task.candidate.job.v
            self.submitted.append((v, task.time_limit))
            self.steps[v] -= 30.0 if v == 5 and self.steps[v] == 105.0 else 1.0
            self.done.append(scored(v, self.steps[v]))

        def next_done(self) -> Scored:
            return self.done.pop(0)

    for left, first, second in ((101.0, [1, 2, 3, 4, 5], [5, 1, 2]), (30.0, [], [1, 2, 3])):
        found = SearchResult(scored=[scored(v, 100.0 + v) for v in range(1, 9)])
        executor = Refining()
        refine(None, found, executor, count=3,  # type: ignore[arg-type]
               deadline=time.perf_counter() + left)  # fmt: skip
        assert [v for v, _ in executor.submitted] == first + second
        limits = [limit for _, limit in executor.submitted]
        assert limits[: len(first)] == [10.0] * len(first)
        assert sum(limits[len(first) :]) == pytest.approx(left, rel=0.01)  # the fakes take no time


def test_split_rows_are_the_reserved_bytes_the_profile_cap_counts() -> None:
    """Table 5's 405B job on the 500 W card (a pipelined step's fragmentation): the split
    model's rows are the profile's static bytes plus the fragmentation of the held fp32
    gradients, and its activations carry their share too, so a split the model fits is one
    the profile's cap (:func:`pp_opt.profiler.memory_breakdown.cap_bytes`) accepts."""
    from pp_opt.planner.candidates import config_split_model
    from pp_opt.planner.split import MEMORY_SCALE
    from pp_opt.profiler.analytic import reserved_static_terms
    from pp_opt.profiler.memory_breakdown import fragmentation_share

    card, hw = load_model_card("llama3.1-405b"), load_hardware_card("h100-96gb-500w")
    job = Job(tp=8, pp=8, dp=8, dp_shard=8, mbs=4, microbatches=8, seq=8192, ac="full",
              fp8=True, compile=True, async_tp=True)  # fmt: skip
    inputs = PlanInputs(model=card, hardware=hw, gpus=512, global_batch=256, seq=8192)
    model = config_split_model(inputs, job)
    share = fragmentation_share(hw, job)
    assert share > 0
    split = (15, 16, 16, 16, 16, 17, 16, 14)  # not the even split the rows are anchored on
    placed = job.with_layers(split)
    stages = stage_costs(card, hw, placed)
    terms = reserved_static_terms(card, stages, placed, hw)
    assert all(t["fragmentation_of_held_gradients"] > 0 for t in terms)
    need = [sum(t.values()) for t in terms]
    rows = model.memory(split, (0,) * model.stages)
    for row, bytes_ in zip(rows, need, strict=True):
        assert abs(row * MEMORY_SCALE - bytes_) <= 3 * MEMORY_SCALE
    one = model.memory(split, (1,) * model.stages)
    activations = [s.m_b for s in stages]
    for d, (with_one, row) in enumerate(zip(one, rows, strict=True)):
        expected = (1 + share) * activations[d]  # each layer's MiB rounded up in the model
        assert abs((with_one - row) * MEMORY_SCALE - expected) <= (split[d] + 2) * MEMORY_SCALE
