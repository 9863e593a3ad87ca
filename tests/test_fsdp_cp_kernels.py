"""FSDP, context-parallel and kernel-effect formulas against closed forms."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pp_opt.errors import ProblemError
from pp_opt.job import Job
from pp_opt.profiler.analytic import unit_costs
from pp_opt.profiler.cards import load_hardware_card, load_model_card
from pp_opt.profiler.context_parallel import gathered_attention, kv_block_bytes, ring_attention
from pp_opt.profiler.formulas import LayerShape
from pp_opt.profiler.fsdp import (
    fsdp_shard,
    pipelined_exposed_time,
    ring_bytes,
    ring_time,
    sharded_state_bytes,
    step_traffic,
    unsharded_bytes,
)
from pp_opt.profiler.kernels import (
    elementwise_bytes,
    fp8_cast_bytes,
    gemm_seconds,
    tp_collective_bytes,
    tp_exposed_s,
)
from pp_opt.profiler.moe import gathered_kv_costs, layer_unit
from pp_opt.profiler.stacks import load_stack_card


def test_sharded_state_is_16_bytes_per_parameter_over_the_shard_degree() -> None:
    assert sharded_state_bytes(8e9, shard=8) == pytest.approx(16e9)
    assert sharded_state_bytes(8e9, shard=128) == pytest.approx(1e9)
    assert unsharded_bytes(1e9, param_bytes=1.0) == pytest.approx(5e9)
    assert unsharded_bytes(1e9, with_grads=False) == pytest.approx(2e9)
    with pytest.raises(ProblemError, match="dp_shard"):
        sharded_state_bytes(1e9, shard=0)


def test_ring_collectives() -> None:
    assert ring_bytes(8e9, 8) == pytest.approx(7e9)
    assert ring_time(8e9, 8, gbs=50.0, latency_us=20.0) == pytest.approx(7 * 20e-6 + 7e9 / 50e9)
    assert ring_time(8e9, 1, gbs=50.0, latency_us=20.0) == 0.0


def test_step_traffic_with_and_without_a_pipeline() -> None:
    plain = step_traffic(1e9, shard=8, pipelined=False)
    piped = step_traffic(1e9, shard=8, pipelined=True, param_bytes=1.0)
    assert plain.all_gather_bytes == pytest.approx(2 * 2e9 * 7 / 8)
    assert piped.all_gather_bytes == pytest.approx(1e9 * 7 / 8)
    assert plain.reduce_scatter_bytes == piped.reduce_scatter_bytes == pytest.approx(3.5e9)
    assert plain.all_reduce_bytes == 0.0
    hsdp = step_traffic(1e9, shard=8, replicate=4, pipelined=True)
    assert hsdp.all_reduce_bytes == pytest.approx(2 * (4e9 / 8) * 3 / 4)


def test_pipelined_exposure_is_first_gather_plus_last_reduce_scatter() -> None:
    got = pipelined_exposed_time(first_layer_gather_s=0.01, layer_gather_s=0.01,
                                 layer_forward_s=0.04, layers=16,
                                 last_stage_reduce_scatter_s=0.4)  # fmt: skip
    assert got == pytest.approx(0.41)
    slow = pipelined_exposed_time(first_layer_gather_s=0.05, layer_gather_s=0.05,
                                  layer_forward_s=0.04, layers=3,
                                  last_stage_reduce_scatter_s=0.0)  # fmt: skip
    assert slow == pytest.approx(0.05 + 2 * 0.01)


def test_ring_attention_bytes_and_overlap() -> None:
    block = kv_block_bytes(s=65536, b=1, h_kv=1024, cp=2)
    assert block == 2 * 2 * 32768 * 1024
    quick = ring_attention(s=65536, b=1, h_kv=1024, cp=2, attention_f_s=1.0,
                           attention_b_s=2.0, link_gbs=450.0)  # fmt: skip
    # F gathers the other shard; B gathers it again and passes the fp32 gradients twice
    assert quick.forward_bytes == block and quick.backward_bytes == block + 2 * 2 * block
    assert quick.forward_exposed_s == 0.0
    # the last gradient hop, after the loop, is waited at once
    assert quick.backward_exposed_s == pytest.approx(2 * block / 450e9)
    slow = ring_attention(s=65536, b=1, h_kv=1024, cp=4, attention_f_s=0.0, attention_b_s=0.0,
                          link_gbs=1.0, rotate="alltoall")  # fmt: skip
    step = kv_block_bytes(s=65536, b=1, h_kv=1024, cp=4) / 1e9
    assert slow.forward_exposed_s == pytest.approx(3 * step)
    assert slow.backward_exposed_s == pytest.approx(3 * step + 4 * 2 * step)
    none = ring_attention(s=8192, b=1, h_kv=1024, cp=1, attention_f_s=1.0, attention_b_s=1.0,
                          link_gbs=1.0)  # fmt: skip
    assert none.forward_bytes == 0.0
    with pytest.raises(ProblemError, match="cp"):
        kv_block_bytes(s=1000, b=1, h_kv=8, cp=3)


def test_compiled_ring_hides_nothing_and_buffers_are_counted() -> None:
    # torch.compile traces the ring: every collective is waited when issued
    kw = {"s": 65536, "b": 1, "h_kv": 4096, "cp": 4, "link_gbs": 100.0, "latency_us": 10.0}
    ring = ring_attention(**kw, attention_f_s=10.0, attention_b_s=20.0, serialized=True)
    block = 2 * 2 * 16384 * 4096
    hop, grad_hop = 10e-6 + block / 100e9, 10e-6 + 2 * block / 100e9
    assert ring.forward_exposed_s == pytest.approx(3 * hop)
    assert ring.backward_exposed_s == pytest.approx(3 * hop + 4 * grad_hop)
    # gathered shards (cp blocks), the fp32 query gradient, three fp32 key/value gradients
    query = 16384 * 4096
    assert ring.backward_buffer_bytes == pytest.approx(4 * block + 4 * query + 3 * 2 * block)
    eager = ring_attention(**kw, attention_f_s=10.0, attention_b_s=20.0)
    assert eager.forward_exposed_s == 0.0 and eager.backward_exposed_s == pytest.approx(grad_hop)


def test_gemm_time_splits_between_bf16_and_fp8() -> None:
    got = gemm_seconds(bf16_flops=1e15, fp8_flops=2e15, bf16_tflops=1000.0, bf16_efficiency=0.5,
                       fp8_tflops=2000.0, fp8_efficiency=0.5)  # fmt: skip
    assert got == pytest.approx(2.0 + 2.0)


def test_compile_moves_fewer_bytes_and_fp8_casts_cost_bytes() -> None:
    shape = LayerShape.of(load_model_card("llama3-8b"), s=8192, b=2)
    h, h_kv, f, sb = 4096, 1024, 14336, 2 * 8192
    assert elementwise_bytes(shape, compiled=False) == sb * (112 * h + 24 * h_kv + 10 * f)
    assert elementwise_bytes(shape, compiled=True) == sb * (28 * h + 4 * h_kv + 6 * f)
    assert fp8_cast_bytes(shape) > 0


def test_tp_collectives_and_async_overlap() -> None:
    shape = LayerShape.of(load_model_card("llama3.1-405b"), s=8192, b=4, tp=8)
    fwd, bwd = tp_collective_bytes(shape)
    full = 4 * 8192 * 16384 * 7 / 8
    assert fwd == pytest.approx(8 * full) and bwd == pytest.approx(8 * full)
    assert tp_collective_bytes(shape, fp8_gather=True)[0] == pytest.approx(6 * full)
    assert tp_exposed_s(1.0, 5.0, tp=8, async_tp=False) == 1.0
    assert tp_exposed_s(1.0, 5.0, tp=8, async_tp=True) == pytest.approx(1 / 8)
    assert tp_exposed_s(2.0, 1.0, tp=8, async_tp=True) == pytest.approx(2 / 8 + 7 / 8)
    assert tp_exposed_s(2.0, 1.0, tp=1, async_tp=True) == 0.0


def test_ring_round_bytes_closed_form() -> None:
    from pp_opt.profiler.context_parallel import (
        ACCUMULATE_BYTES,
        CAT_BYTES,
        FLASH_BWD_CALL_BYTES,
        MERGE_BYTES,
        SEND_BYTES,
        ring_round_bytes,
    )

    assert ring_round_bytes(s=8192, b=1, h_q=4096, h_kv=4096, cp=1) == (0.0, 0.0)
    fwd, bwd = ring_round_bytes(s=65536, b=2, h_q=4096, h_kv=1024, cp=4, tp=2)
    q = 2 * 16384 * 4096 / 2
    kv = 2 * 2 * 16384 * 1024 / 2
    assert fwd == pytest.approx(3 * q * (MERGE_BYTES + CAT_BYTES / 2))
    per_round = q * (FLASH_BWD_CALL_BYTES + ACCUMULATE_BYTES + CAT_BYTES / 2) + kv * (
        ACCUMULATE_BYTES + SEND_BYTES + CAT_BYTES / 2
    )
    assert bwd == pytest.approx(4 * per_round)


def test_permute_rate_carries_the_gradient_hops() -> None:
    kw = {"s": 65536, "b": 1, "h_kv": 4096, "cp": 4, "link_gbs": 100.0}
    ring = ring_attention(**kw, attention_f_s=0.0, attention_b_s=0.0, serialized=True,
                          permute_gbs=50.0)  # fmt: skip
    block = 2 * 2 * 16384 * 4096
    assert ring.forward_exposed_s == pytest.approx(3 * block / 100e9)
    assert ring.backward_exposed_s == pytest.approx(3 * block / 100e9 + 4 * 2 * block / 50e9)
    ring = ring_attention(**kw, attention_f_s=0.0, attention_b_s=0.0, serialized=True,
                          permute_gbs=50.0, rotate="alltoall")  # fmt: skip
    assert ring.forward_exposed_s == pytest.approx(3 * block / 50e9)


def test_megatron_context_parallel_shares_the_distributed_optimizer_not_fsdp() -> None:
    """torchtitan shards FSDP over ``dp_shard x cp``; Megatron-Core's CP ranks join the
    distributed optimizer's data-parallel group instead (no FSDP without ``dp_shard``), so a
    stage's static memory at CP 2 x DP 4 is the one at DP 8 (the ModelZoo's Qwen3-235B 32k
    run: 147 GiB of FSDP terms on the last rank before, which called it infeasible)."""
    from pp_opt.job import Job
    from pp_opt.profiler.analytic import profile_analytic
    from pp_opt.profiler.cards import load_hardware_card
    from pp_opt.profiler.fsdp import fsdp_on

    card, hw = load_model_card("qwen3-235b-a22b"), load_hardware_card("h100-80gb")
    layers = (2, *[3] * 30, 2)
    statics = []
    for cp in (1, 2):
        job = Job(pp=8, microbatches=64, seq=16384 * cp, tp=4, cp=cp, v=4, ep=8, dp=8 // cp,
                  dp_replicate=8 // cp, dispatcher="deepep", ac="modules:layernorm,moe",
                  stack="megatron-core", layers=layers)  # fmt: skip
        assert not fsdp_on(job)
        statics.append(profile_analytic(card, hw, job).static)
    assert statics[0] == pytest.approx(statics[1])
    titan = Job(pp=1, microbatches=1, seq=65536, cp=2, dp=4, dp_shard=4)
    assert fsdp_on(titan) and fsdp_shard(titan) == 8


def test_gathered_keys_and_values_are_waited_at_once_and_held_in_the_backward() -> None:
    """torchtitan 0.3.0's FlexAttention under CP: one all-gather of the other shards in F,
    one reduce-scatter of their gradients in B, neither hidden, no rounds to merge."""
    kw = dict(s=65536, b=1, h_kv=1024, cp=4, tp=1, dtype_bytes=2)
    block = kv_block_bytes(**kw)
    got = gathered_attention(**kw, link_gbs=100.0, latency_us=10.0)
    assert got.forward_bytes == got.backward_bytes == pytest.approx(3 * block)
    exposed = 3 * 10e-6 + 3 * block / 100e9
    assert got.forward_exposed_s == got.backward_exposed_s == pytest.approx(exposed)
    assert got.backward_buffer_bytes == pytest.approx(8 * block)
    single = gathered_attention(**{**kw, "cp": 1}, link_gbs=100.0)
    assert single.forward_exposed_s == single.backward_exposed_s == 0.0


def test_each_torchtitan_runs_context_parallel_attention_its_own_way() -> None:
    """9dec370 (SDPA): torch's ring at the query width with fp32 merges; 0.3.0 (FlexAttention):
    the keys and values gathered at their own width, so the same job costs less there."""
    new, old = load_stack_card("torchtitan"), load_stack_card("torchtitan-2412")
    assert (new.cp_attention, new.cp_kv_width) == ("gathered", "kv")
    assert (old.cp_attention, old.cp_kv_width) == ("ring", "query")
    card, hw = load_model_card("llama3-8b"), load_hardware_card("h100-96gb-500w")
    job = Job(pp=1, microbatches=1, seq=131072, cp=4, dp_shard=2, dp=2, ac="full")
    ring = unit_costs(card, hw, replace(job, stack="torchtitan-2412")).layer
    gathered = unit_costs(card, hw, job).layer
    assert gathered["t_f"] < ring["t_f"] and gathered["t_b"] < ring["t_b"]
    plain = unit_costs(card, hw, replace(job, cp=1, seq=131072 // 4)).layer
    assert gathered["t_f"] > plain["t_f"]  # four times the keys, and the gather on top


def test_an_moe_layer_on_torchtitan_0_3_pays_the_gather_of_its_keys_and_values() -> None:
    card, hw = load_model_card("qwen3-30b-a3b"), load_hardware_card("h100-80gb")
    job = Job(pp=1, microbatches=1, seq=32768, cp=4, dp_shard=2, dp=2, ep=2)
    f, b, buffer = gathered_kv_costs(card, hw, job, load_stack_card("torchtitan"))
    block = kv_block_bytes(s=32768, b=1, h_kv=card.kv_hidden, cp=4)
    assert f == b == pytest.approx(1e3 * (3 * 10e-6 + 3 * block / (450e9 * 0.8)))
    assert buffer == pytest.approx(8 * block)
    megatron = replace(job, stack="megatron-core", dp_shard=1, dp_replicate=2)
    assert gathered_kv_costs(card, hw, megatron, load_stack_card("megatron-core")) == (0, 0, 0)
    without = replace(job, cp=1, seq=32768 // 4)  # the same tokens per GPU, no keys to gather
    assert (
        layer_unit(card, hw, job, moe=True)["t_f"]
        > layer_unit(card, hw, without, moe=True)["t_f"] + f
    )
