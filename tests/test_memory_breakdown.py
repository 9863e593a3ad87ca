"""Issue 40: a rank's peak memory from named terms that add up to it, no total multiplier."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from pp_opt.job import Job
from pp_opt.planner.predict import predict, prediction_job
from pp_opt.profiler.analytic import (
    stage_costs,
    stage_transients,
    static_memory_terms,
    unit_costs,
)
from pp_opt.profiler.cards import GIB, load_hardware_card, load_model_card
from pp_opt.profiler.memory_breakdown import (
    TERMS,
    allocator_static_bytes,
    breakdown_table,
    cached_layer_bytes,
    largest_term,
)

T5 = dict(model="llama3.1-405b", hardware="h100-96gb-500w", gpus=512, global_batch=256,
          seq=8192, tp=8, pp=8, dp_shard=8, mbs=4, ac="full", fp8=True, compile=True,
          async_tp=True)  # fmt: skip
T1 = dict(model="llama3-8b", hardware="h100-96gb-500w", gpus=8, global_batch=16, seq=8192,
          dp_shard=8, mbs=2, ac="selective_op", stack="torchtitan-2412")  # fmt: skip
"""The published rows ran torchtitan 9dec370 (its whole-microbatch fp32 loss, SDPA's ring)."""


T2_CP8 = dict(model="llama3-8b", hardware="h100-96gb-500w", gpus=8, global_batch=1,
              seq=262144, cp=8, dp_shard=1, mbs=1, ac="full", fp8=True, compile=True,
              stack="torchtitan-2412")  # fmt: skip
T4 = dict(model="llama3-70b", hardware="h100-96gb-500w", gpus=256, global_batch=512, seq=8192,
          tp=8, dp_shard=32, mbs=16, ac="full", fp8=True, compile=True,
          stack="torchtitan-2412")  # fmt: skip
NEW = {"stack": "torchtitan"}  # 0.3.0: the chunked loss, K/V gathered under CP


@pytest.mark.parametrize("kwargs", [
    T1, T2_CP8, T4, {**T5, "schedule": "1F1B"}, {**T5, "schedule": "Interleaved1F1B"},
    {**T1, **NEW}, {**T2_CP8, **NEW}, {**T5, **NEW, "schedule": "1F1B"},
])  # fmt: skip
def test_breakdown_adds_up_to_the_peak(kwargs: dict) -> None:
    got = predict(**kwargs)
    assert len(got.memory_breakdown) == len(got.peak_memory)
    for rank, peak in zip(got.memory_breakdown, got.peak_memory, strict=True):
        total = sum(rank[t] for t in TERMS)
        assert total == pytest.approx(peak, rel=5e-3)
        assert rank["reserved"] == pytest.approx(peak, rel=1e-9)
        assert rank["allocated"] == pytest.approx(total - rank["allocator"], rel=1e-9)
        assert all(rank[t] >= 0 for t in TERMS)
    assert got.to_dict()["memory_breakdown"][0]["reserved"] == got.peak_memory[0]
    assert "reserved" in breakdown_table(got.memory_breakdown)


def test_the_terms_the_issue_names_apply() -> None:
    fsdp = predict(**T1).memory_breakdown[0]
    for term in ("parameters", "gradients", "optimizer_state", "fsdp_unsharded_params",
                 "activations", "loss", "allocator"):  # fmt: skip
        assert fsdp[term] > 0, term
    pipelined = predict(**T5, schedule="1F1B", stack="torchtitan-2412").memory_breakdown
    for term in ("fsdp_accumulated_grads", "pipeline_buffers", "recompute_buffer"):
        assert pipelined[1][term] > 0, term
    assert pipelined[-1]["output_logits"] > 0 and pipelined[0]["output_logits"] == 0
    assert largest_term(pipelined[1]).startswith("fsdp_accumulated_grads ")
    # torchtitan 0.3.0 steps the schedule without outputs: the last stage keeps no logits
    now = predict(**T5, schedule="1F1B").memory_breakdown
    assert now[-1]["output_logits"] == 0 and now[1] == pipelined[1]


def test_no_multiplier_on_the_total() -> None:
    """Without a pipeline the reserved peak is the allocated one plus FSDP's cached
    all-gather buffers and, when the loss holds the peak, the last layer's cached working
    set; the card has no total multiplier any more."""
    hw = load_hardware_card("h100-96gb-500w")
    assert not hasattr(hw, "memory_overhead")
    rank = predict(**T1).memory_breakdown[0]
    assert rank["reserved"] - rank["allocated"] == pytest.approx(rank["allocator"])
    assert rank["loss"] > 0 and rank["recompute_buffer"] == 0
    assert rank["allocator"] < 0.06 * rank["reserved"]


def test_the_loss_peak_keeps_the_last_layers_blocks_cached() -> None:
    """Closed form: without a pipeline, a loss-held peak reserves the layer transient (the
    blocks the last checkpointed layer freed) on top of FSDP's gather buffers."""
    card, hw = load_model_card("llama3-70b"), load_hardware_card("h100-96gb-500w")
    job = prediction_job(card, gpus=256, global_batch=512, seq=8192, schedule="1F1B", tp=8,
                         dp_shard=32, mbs=16, ac="full", fp8=True, compile=True,
                         stack="torchtitan-2412")  # fmt: skip
    units = unit_costs(card, hw, job)
    ((layer, loss),) = stage_transients(units, job)
    assert loss > layer > 0
    stages = stage_costs(card, hw, job)
    terms = static_memory_terms(card, stages, job, hw)[0]
    gathers = allocator_static_bytes(card, job, stages, 0)
    assert terms["allocator"] == pytest.approx(gathers + layer)
    assert cached_layer_bytes(job, layer) == layer
    assert cached_layer_bytes(replace(job, pp=2, layers=(40, 40)), layer) == 0.0


def test_context_parallel_shards_the_state() -> None:
    """torchtitan shards FSDP over dp_shard x cp: static state falls with cp."""
    base = dict(model="llama3-8b", hardware="h100-96gb-500w", gpus=8, global_batch=1,
                dp_shard=1, mbs=1, ac="full", fp8=True, compile=True)  # fmt: skip
    got = predict(**base, seq=262144, cp=8).memory_breakdown[0]
    ref = predict(**{**base, "global_batch": 8, "dp_shard": 8}, seq=32768).memory_breakdown[0]
    for term in ("parameters", "gradients", "optimizer_state"):
        assert got[term] == pytest.approx(ref[term], rel=1e-6)


def test_the_cap_keeps_the_reported_reserved_peak_on_the_card() -> None:
    """The allocator's fragmentation applies to what comes and goes within a pipelined step,
    the held fp32 gradients as well as the activations (as the reported peak counts it): at
    the cap, ``s + A + share (A + H)`` is the card's usable memory, so a schedule the solver
    accepts is never reported above the card."""
    from pp_opt.profiler.memory_breakdown import (
        cap_bytes,
        device_caps,
        fragmentation_share,
        usable_needed,
    )

    hw = load_hardware_card("h100-96gb-500w")
    job = Job(pp=8, microbatches=8, seq=8192, tp=8, dp=8, dp_shard=8)
    share = fragmentation_share(hw, job)
    assert share > 0
    static, held = [40 * GIB, 50 * GIB], [20 * GIB, 24 * GIB]
    cap = cap_bytes(hw, job, static, held)
    room = [cap - s for s in static]
    reserved = [s + a + share * (a + h) for s, a, h in zip(static, room, held, strict=True)]
    assert max(reserved) == pytest.approx(hw.usable_bytes)
    assert cap < cap_bytes(hw, job, static)  # without the held gradients: above the card
    caps = device_caps(hw, job, static, held)  # each device's own: all of them at the card
    assert min(caps) == cap and caps[1] > caps[0]
    for s, c, h in zip(static, caps, held, strict=True):
        assert s + (c - s) * (1 + share) + share * h == pytest.approx(hw.usable_bytes)
        assert usable_needed(hw, job, s, h, c) == pytest.approx(hw.usable_bytes)


def test_an_infeasible_prediction_names_its_largest_term() -> None:
    """Table 5's job without checkpointing: the note says what overflows, in the reserved
    memory the card is measured by."""
    got = predict(**{**T5, "ac": "none"}, schedule="1F1B")
    assert got.status == "infeasible" and got.step_time is None
    assert "largest term at its peak: activations" in got.note
    assert "h100-96gb-500w has 91.0 (95 GiB less a 4 GiB reserve)" in got.note
    # what it needs is its reserved peak, the memory the breakdown counts
    need = re.search(r"1F1B needs ([0-9.]+) GiB usable on pipeline rank (\d)", got.note)
    assert need is not None, got.note
    peak = re.search(r"of ([0-9.]+) GiB$", got.note)  # the largest term's reserved total
    assert peak is not None, got.note
    assert float(need[1]) == pytest.approx(float(peak[1]), abs=0.06)
    # a solve's bound: what any schedule needs at least, no more than 1F1B's peak
    solved = predict(**{**T5, "ac": "none"}, layers=[15, 16, 16, 16, 16, 16, 16, 15])
    least = re.search(r"no schedule fits: it needs at least ([0-9.]+) GiB usable", solved.note)
    assert least is not None, solved.note
    assert 91.0 < float(least[1]) <= float(need[1])


def test_each_pipeline_rank_has_its_own_cap_and_the_file_keeps_it() -> None:
    """With the allocator's fragmentation on what a pipelined rank allocates beyond its
    static memory, a rank with more static memory may allocate more before its reserved peak
    reaches the card: the caps differ by rank, the problem and the profile file carry them."""
    import json

    from pp_opt import profile_job
    from pp_opt.profiler.costs import CostProfile, problem_from_profile

    profile = profile_job(Job(pp=4, microbatches=8, seq=2048, tp=2), model="llama3-8b",
                          hardware="h100-96gb-500w")  # fmt: skip
    caps = profile.device_caps()
    assert len(set(caps)) > 1 and profile.cap == min(caps)
    order = sorted(range(4), key=lambda d: profile.static[d])
    assert sorted(caps) == [caps[d] for d in order]  # more static memory, a higher cap
    assert [d.cap for d in problem_from_profile(profile).devices] == list(caps)
    again = CostProfile.from_dict(json.loads(json.dumps(profile.to_dict())))
    assert again.device_caps() == caps and again.cap == profile.cap
