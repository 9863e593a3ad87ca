"""Activation checkpointing modes: kept bytes and re-run FLOPs against closed forms."""

from __future__ import annotations

import pytest

from pp_opt.errors import ProblemError
from pp_opt.profiler.cards import load_model_card
from pp_opt.profiler.checkpointing import (
    layer_checkpoint_cost,
    layer_input_bytes,
    stage_checkpoint_cost,
)
from pp_opt.profiler.formulas import LayerShape, layer_activation_bytes, layer_flops


def llama8b(tp: int = 1, b: int = 2) -> LayerShape:
    return LayerShape.of(load_model_card("llama3-8b"), s=8192, b=b, tp=tp)


def test_none_is_the_plain_layer() -> None:
    shape = llama8b()
    cost = layer_checkpoint_cost(shape, "none")
    assert cost.kept_bytes == layer_activation_bytes(shape)[0]
    assert (cost.f_flops, cost.b_flops, cost.w_flops) == layer_flops(shape)
    assert cost.recompute_flops == 0.0


@pytest.mark.parametrize("tp", [1, 8])
def test_full_keeps_only_the_input_and_reruns_the_forward(tp: int) -> None:
    shape = llama8b(tp=tp)
    full, none = layer_checkpoint_cost(shape, "full"), layer_checkpoint_cost(shape, "none")
    assert full.kept_bytes == 2 * 8192 * 2 * 4096 / tp
    assert full.kept_bytes == layer_input_bytes(shape)
    assert full.recompute_flops == none.f_flops
    assert full.b_flops == none.b_flops + none.f_flops
    assert full.w_flops == none.w_flops
    assert full.transient_bytes == none.kept_bytes


def test_torchtitan_op_selective_keeps_odd_matmuls_and_sdpa() -> None:
    shape = llama8b()
    h, h_kv, f, a, sb = 4096, 1024, 14336, 32, 2 * 8192
    cost = layer_checkpoint_cost(shape, "selective_op")
    # input, wq, wv, w1, w2 outputs and the SDPA output (bf16), log-sum-exp (fp32)
    assert cost.kept_bytes == pytest.approx(sb * (2 * (h + h + h_kv + f + h + h) + 4 * a))
    # wk, wo and w3 are re-run
    assert cost.recompute_flops == pytest.approx(2 * sb * (h * h_kv + h * h + h * f))
    none, full = layer_checkpoint_cost(shape, "none"), layer_checkpoint_cost(shape, "full")
    assert full.kept_bytes < cost.kept_bytes < none.kept_bytes
    assert 0 < cost.recompute_flops < full.recompute_flops


def test_op_selective_keeps_row_parallel_outputs_whole_under_tp() -> None:
    h, h_kv, f, a, sb, t = 4096, 1024, 14336, 32, 2 * 8192, 8
    cost = layer_checkpoint_cost(llama8b(tp=t), "selective_op")
    sharded = 2 * (h + h + h_kv + f + h) + 4 * a  # input, wq, wv, w1, SDPA out, lse
    w2 = 2 * h + 2 * h / t  # partial sum before the reduce-scatter, and its output
    assert cost.kept_bytes == pytest.approx(sb * (sharded / t + w2))


def test_stage_with_some_layers_fully_checkpointed() -> None:
    shape = llama8b()
    full, none = layer_checkpoint_cost(shape, "full"), layer_checkpoint_cost(shape, "none")
    stage = stage_checkpoint_cost(shape, layers=8, full_layers=3)
    assert stage.kept_bytes == pytest.approx(3 * full.kept_bytes + 5 * none.kept_bytes)
    assert stage.recompute_flops == pytest.approx(3 * none.f_flops)
    assert stage.b_flops == pytest.approx(8 * none.b_flops + 3 * none.f_flops)
    assert stage.transient_bytes == full.transient_bytes
    assert stage_checkpoint_cost(shape, layers=8, full_layers=0).transient_bytes == 0.0
    every = stage_checkpoint_cost(shape, layers=8, full_layers=8)
    assert every.kept_bytes == pytest.approx(8 * full.kept_bytes)


def test_bad_mode_and_counts_are_errors() -> None:
    with pytest.raises(ProblemError, match="ac"):
        layer_checkpoint_cost(llama8b(), "sometimes")
    with pytest.raises(ProblemError, match="full_layers"):
        stage_checkpoint_cost(llama8b(), layers=4, full_layers=5)
