"""The loss as each torchtitan runs it: 9dec370's whole-microbatch fp32 loss and 0.3.0's
``ChunkedLossWrapper`` (eight sequence chunks inside the last stage's forward), in closed
form and through ``predict``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import pp_opt
from pp_opt.errors import ProblemError
from pp_opt.job import Job
from pp_opt.profiler.analytic import head_costs
from pp_opt.profiler.cards import GIB, load_hardware_card, load_model_card
from pp_opt.profiler.comm import gemm_ms
from pp_opt.profiler.formulas import head_flops
from pp_opt.profiler.loss import loss_chunks, loss_kept_bytes, loss_transient_bytes
from pp_opt.profiler.stacks import load_stack_card

CARD, HW = load_model_card("llama3-8b"), load_hardware_card("h100-96gb-500w")
NEW = Job(pp=2, microbatches=4, seq=8192, mbs=2, dp_shard=4, dp=4)
OLD = replace(NEW, stack="torchtitan-2412")
TOKENS = 8192 * 2


def test_each_torchtitan_keeps_what_its_loss_keeps() -> None:
    assert (loss_chunks(NEW), loss_chunks(OLD)) == (8, 1)
    assert loss_kept_bytes(CARD, OLD, TOKENS) == 4.0 * TOKENS * CARD.vocab  # fp32 log-softmax
    assert loss_kept_bytes(CARD, NEW, TOKENS) == 2.0 * TOKENS * CARD.hidden  # bf16 dL/dh
    assert loss_transient_bytes(CARD, OLD, TOKENS) == 8.0 * TOKENS * CARD.vocab
    chunk = (2.0 + 4.0 + 8.0) * TOKENS / 8 * CARD.vocab  # bf16 logits, fp32 softmax and grads
    assert loss_transient_bytes(CARD, NEW, TOKENS) == chunk + 4.0 * TOKENS * CARD.hidden


def test_a_chunked_loss_runs_the_output_layer_inside_the_forward() -> None:
    old, new = head_costs(CARD, OLD, HW), head_costs(CARD, NEW, HW)
    gemm = gemm_ms(head_flops(CARD, TOKENS), HW)
    assert old["t_w"] == pytest.approx(gemm) and new["t_w"] == new["t_b"] == 0.0
    assert new["t_f"] == pytest.approx(old["t_f"] + old["t_b"] + old["t_w"])
    assert new["m_w"] == 0.0 and new["m_b"] < old["m_b"] / 10


def test_predict_counts_one_chunk_of_the_loss_on_torchtitan_0_3() -> None:
    common = dict(model="llama3-8b", hardware="h100-96gb-500w", gpus=8, global_batch=16,
                  seq=8192, dp_shard=8, mbs=2, ac="selective_op")  # fmt: skip
    old = pp_opt.predict(**common, stack="torchtitan-2412")
    new = pp_opt.predict(**common)
    assert new.step_time == pytest.approx(old.step_time)  # one stage: the same work
    loss = new.memory_breakdown[0]["loss"]
    job = Job(pp=1, microbatches=1, seq=8192, mbs=2, dp_shard=8, dp=8)
    held = loss_transient_bytes(CARD, job, TOKENS) + loss_kept_bytes(CARD, job, TOKENS)
    assert loss == pytest.approx(held, rel=1e-6)  # one chunk running, its microbatch's dL/dh
    assert old.memory_breakdown[0]["loss"] > 5 * loss
    assert new.peak_memory[0] < old.peak_memory[0] - 15 * GIB


def test_the_stack_card_takes_a_whole_number_of_chunks(tmp_path: Path) -> None:
    assert load_stack_card("megatron-core").loss_chunks == 1
    for bad in ("0", "2.5", "true"):
        card = tmp_path / f"stack-bad{bad}.toml"
        card.write_text(f"loss_chunks = {bad}\n")
        with pytest.raises(ProblemError, match="loss_chunks"):
            load_stack_card(str(card))
