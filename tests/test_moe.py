"""Mixture-of-Experts costs: the cards' parameter counts, the all-to-all's closed form, expert
state over the expert data-parallel ranks, bad input, and the published runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import pp_opt
from pp_opt.errors import ProblemError
from pp_opt.job import Job
from pp_opt.profiler.cards import GB, load_hardware_card, load_model_card, model_card_from_dict
from pp_opt.profiler.formulas import embedding_params, head_params
from pp_opt.profiler.moe import Layout, dispatch_ms, layer_params
from pp_opt.profiler.stacks import load_stack_card

ROOT = Path(__file__).resolve().parent.parent
HW = load_hardware_card("h100-80gb")


@pytest.mark.parametrize(
    ("name", "total", "active"),
    [("deepseek-v3", 671.0, 37.0), ("kimi-k2", 1026.0, 32.5), ("qwen3-235b-a22b", 235.0, 22.0),
     ("qwen3-30b-a3b", 30.5, 3.3), ("gpt-oss-120b", 116.8, 5.1)],
)  # fmt: skip
def test_the_cards_count_the_published_parameters(name: str, total: float, active: float) -> None:
    """Totals from each model's card (DeepSeek-V3 report: 671B, 37B active, MTP apart; Kimi K2:
    1.04T, 32B; Qwen3: 235B/22B, 30.5B/3.3B; gpt-oss: 116.8B, 5.1B active)."""
    card = load_model_card(name)
    dense, experts = layer_params(card, True)
    plain, _ = layer_params(card, False)
    ends = embedding_params(card) + head_params(card)
    count = card.moe_layers * (dense + experts) + card.dense_layers * plain + ends
    used = card.moe_layers * (dense + experts * card.top_k / card.experts)
    used += card.dense_layers * plain + ends
    assert count / 1e9 == pytest.approx(total, rel=0.01)
    assert used / 1e9 == pytest.approx(active, rel=0.13)  # gpt-oss counts its embedding apart


def test_a_dispatch_inside_a_node_is_its_copies_over_nvlink() -> None:
    card = load_model_card("qwen3-30b-a3b")
    stack = load_stack_card("megatron-core")
    lay = Layout(tokens=4096, seq=4096, tp=1, ep=8, etp=1, imbalance=1.0, dispatcher="alltoall",
                 fp8=False)  # fmt: skip
    copies = 4096 * card.top_k * 7 / 8
    expected = 1e3 * copies * card.hidden * 2 / (HW.intra_node_gbs * GB * 0.6) + 0.03
    assert dispatch_ms(card, HW, lay, stack, dtype_bytes=2.0) == pytest.approx(expected)
    # DeepEP across nodes sends a token once per remote node it reaches, at most node_limit
    wide = Layout(tokens=4096, seq=4096, tp=1, ep=64, etp=1, imbalance=1.0, dispatcher="deepep",
                  fp8=False)  # fmt: skip
    a2a = Layout(tokens=4096, seq=4096, tp=1, ep=64, etp=1, imbalance=1.0, dispatcher="alltoall",
                 fp8=False)  # fmt: skip
    v3 = load_model_card("deepseek-v3")
    assert dispatch_ms(v3, HW, wide, stack, dtype_bytes=2.0) < dispatch_ms(
        v3, HW, a2a, stack, dtype_bytes=2.0
    )


def test_expert_state_shards_over_the_expert_data_parallel_ranks() -> None:
    common = dict(pp=2, microbatches=8, seq=4096, ep=8, stack="megatron-core", ac="full")
    few = pp_opt.profile_job(Job(dp=8, **common), model="qwen3-30b-a3b", hardware=HW)
    many = pp_opt.profile_job(Job(dp=64, **common), model="qwen3-30b-a3b", hardware=HW)
    assert few.stages[0].expert_params == many.stages[0].expert_params > 0
    assert many.static[0] < few.static[0]
    # the all-to-all is the communication part of F where the GPU, not the host, sets the
    # pace (four sequences a microbatch); one sequence's layers are host-bound: none to hide
    wide = pp_opt.profile_job(Job(dp=8, **{**common, "mbs": 4}), model="qwen3-30b-a3b",
                              hardware=HW)  # fmt: skip
    assert wide.stages[0].t_f_comm > 0 and wide.stages[0].t_f > wide.stages[0].t_f_comm
    assert few.stages[0].t_f_comm == 0


@pytest.mark.parametrize(
    ("t_f", "t_b", "t_w", "a2a", "host", "expected"),
    [
        (5.0, 6.0, 2.0, 1.0, 0.0, (5.0, 6.0, 1.0, 1.0)),  # no host time: as the GPU runs
        (5.0, 6.0, 2.0, 1.0, 3.0, (5.0, 6.0, 1.0, 1.0)),  # host quicker than the compute
        (5.0, 6.0, 2.0, 3.0, 3.0, (5.0, 6.0, 2.0, 2.0)),  # F: 5 - max(3, 2); BW: 8 - max(6, 5)
        (2.0, 3.0, 1.0, 1.0, 3.0, (3.0, 5.0, 0.0, 0.0)),  # host-bound: 3 and 2 x 3 - t_w
    ],
)
def test_a_host_bound_layer_lasts_its_host_time_and_hides_no_communication(
    t_f, t_b, t_w, a2a, host, expected
) -> None:
    """``host_bound``: a pass lasts ``max(gpu, host)`` (backward ``2 host``, with ``t_w``); a
    pair hides ``max(host, gpu) - max(host, gpu - a2a)`` of it."""
    from pp_opt.profiler.moe import host_bound

    assert host_bound(t_f, t_b, t_w, a2a, host) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("model", "fields", "field"),
    [("deepseek-v3", dict(ep=3, dp=3), "ep"), ("llama3-8b", dict(ep=2, dp=2), "ep"),
     ("deepseek-v3-debug", dict(etp=3, dp=3), "etp")],
)  # fmt: skip
def test_expert_settings_that_do_not_fit_the_card_name_their_field(
    model: str, fields: dict[str, int], field: str
) -> None:
    job = Job(pp=1, microbatches=2, seq=512, **fields)  # type: ignore[arg-type]
    with pytest.raises(ProblemError) as err:
        pp_opt.profile_job(job, model=model, hardware=HW)
    assert err.value.field == field and "\n" not in str(err.value)


def test_a_card_missing_an_moe_field_names_it() -> None:
    base = dict(layers=4, hidden=256, heads=4, vocab=1000, seq=128, experts=8, moe_ffn=64)
    with pytest.raises(ProblemError) as err:
        model_card_from_dict(base)
    assert err.value.field == "model.top_k"


def test_the_published_moe_runs_are_configurations_pp_opt_accepts() -> None:
    """Every published row predicts a step time (never infeasible), each within 15% of its
    measured TPS/GPU (ModelZoo's long-context rows, published in TFLOPS, within 5%), and the
    ModelZoo pair without / with the A2A overlap 1.12 +- 0.06 apart, as measured (19.7 s /
    17.6 s; ``python scripts/bench_published.py`` prints them)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_published

    results = {r["id"]: r for r in bench_published.moe_results()}
    data = json.loads((ROOT / "scripts/published/moe_rows.json").read_text())
    assert set(results) == {row["id"] for row in data["rows"]}
    assert all(r["step_time_ms"] for r in results.values())
    assert all(abs(r["tps_ratio"] - 1) <= 0.15 for r in results.values()), results
    assert results["automodel-deepseek-v3-1024"]["predict"]["grad_accum"] == 4  # ran GA 4
    long_context = [r for r in results.values() if r["measured_tflops"]]
    assert len(long_context) == 4 and all(abs(r["tps_ratio"] - 1) <= 0.05 for r in long_context)
    plain, overlapped = (results[k]["step_time_ms"] for k in
                         ("modelzoo-qwen3-235b", "modelzoo-qwen3-235b-a2a-overlap"))  # fmt: skip
    assert abs(plain / overlapped - 1.12) <= 0.06


def test_model_flops_count_the_routed_experts_a_token_runs() -> None:
    """MFU counts 6 x the active parameters per token (37B for DeepSeek-V3, 3.3B for
    Qwen3-30B-A3B) plus attention's products, not the dense MLP width an MoE card leaves
    unused."""
    from pp_opt.profiler.moe import model_flops_per_sequence

    for name, active, attention in (("deepseek-v3", 37.6e9, 0.15), ("qwen3-30b-a3b", 3.4e9, 0.2)):
        per_token = model_flops_per_sequence(load_model_card(name), 4096) / 4096 / 6
        assert active < per_token < active * (1 + attention)


def test_an_overlapping_job_profiles_a_problem_with_pairs() -> None:
    """``overlap`` gives the problem its pairs and the stack's overhead; each stage's all-to-all
    is what a pair may hide (four sequences a microbatch: the GPU, not the host, sets the
    pace), and nothing where the stack runs a pair's halves in sequence."""
    common = dict(pp=4, placement="v", microbatches=8, seq=4096, mbs=4, dp=8, ep=8, overlap=True)
    mega = pp_opt.problem_from_profile(pp_opt.profile_job(
        Job(stack="megatron-core", **common), model="qwen3-30b-a3b", hardware=HW))  # fmt: skip
    titan = pp_opt.problem_from_profile(pp_opt.profile_job(
        Job(stack="torchtitan", **common), model="qwen3-30b-a3b", hardware=HW))  # fmt: skip
    assert mega.pairs and mega.pair_overhead == load_stack_card("megatron-core").pair_overhead
    assert all(0 < s.t_f_comm < s.t_f and s.t_b_comm > 0 for s in mega.stages)
    assert titan.pairs and all(s.t_f_comm == s.t_b_comm == 0 for s in titan.stages)
    plain = pp_opt.problem_from_profile(pp_opt.profile_job(
        Job(stack="megatron-core", **{**common, "overlap": False}), model="qwen3-30b-a3b",
        hardware=HW))  # fmt: skip
    assert not plain.pairs and all(s.t_f_comm == 0 for s in plain.stages)


def test_a_named_schedule_overlaps_its_pairs_where_the_run_does() -> None:
    """predict --overlap runs DualPipeV's OVERLAP_F_B actions and Megatron-Core's interleaved
    1F1B with its A2A overlap: faster on a stack that overlaps, the same on torchtitan 0.3.0
    (four sequences a microbatch, so that the GPU and not the host sets the pace)."""
    from pp_opt.planner.predict import predict

    args = dict(model="qwen3-30b-a3b", hardware=HW, gpus=32, global_batch=256, seq=4096, pp=4,
                ep=8, dp_replicate=8, mbs=4, ac="full", schedule="DualPipeV", placement="v",
                time_limit=5)  # fmt: skip
    for stack, faster in (("megatron-core", True), ("torchtitan", False)):
        if stack == "torchtitan":  # its experts borrow the FSDP shard group's ranks only
            args = {**args, "dp_replicate": None, "dp_shard": 8}
        apart = predict(stack=stack, **args)  # type: ignore[arg-type]
        paired = predict(stack=stack, overlap=True, **args)  # type: ignore[arg-type]
        assert apart.step_time and paired.step_time
        if faster:
            assert paired.step_time < 0.98 * apart.step_time
        else:
            assert paired.step_time == pytest.approx(apart.step_time, rel=1e-9)
