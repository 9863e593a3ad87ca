"""Issue 27: the job's training features in the one cost path, ``predict`` and the published
bench (closed forms for the new cost terms, the CLI's errors, one published row)."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from cli_helpers import run

import pp_opt
from pp_opt.errors import ProblemError
from pp_opt.job import Job
from pp_opt.profiler.analytic import elementwise_ms, layer_shape, unit_costs
from pp_opt.profiler.cards import load_hardware_card, load_model_card
from pp_opt.profiler.checkpointing import layer_input_bytes
from pp_opt.profiler.comm import fp8_gemm_ms, gemm_ms
from pp_opt.profiler.formulas import attention_core_flops, linear_flops
from pp_opt.profiler.fsdp import sharded_state_bytes
from pp_opt.profiler.kernels import elementwise_bytes

ROOT = Path(__file__).resolve().parents[1]
CARD, HW = load_model_card("llama3-8b"), load_hardware_card("h100-96gb-500w")
BASE = Job(pp=1, microbatches=1, seq=8192, mbs=2)


def test_full_checkpointing_keeps_the_input_and_reruns_the_forward() -> None:
    plain = unit_costs(CARD, HW, BASE).layer
    full = unit_costs(CARD, HW, replace(BASE, ac="full")).layer
    assert full["m_b"] == layer_input_bytes(layer_shape(CARD, BASE))
    assert full["t_f"] == pytest.approx(plain["t_f"])
    assert full["t_b"] == pytest.approx(plain["t_b"] + plain["t_f"])
    assert full["transient"] == pytest.approx(plain["m_b"])  # tp 1: no gathered inputs


def test_fp8_runs_the_linears_at_the_fp8_rate_and_compile_scales_the_elementwise_passes() -> None:
    shape = layer_shape(CARD, BASE)
    lin, core = linear_flops(shape), attention_core_flops(shape)
    elem_f, _ = elementwise_ms(shape, HW)
    compiled = unit_costs(CARD, HW, replace(BASE, compile=True)).layer
    ratio = elementwise_bytes(shape, compiled=True) / elementwise_bytes(shape, compiled=False)
    assert compiled["t_f"] == pytest.approx(gemm_ms(lin + core, HW) + ratio * elem_f)
    fp8 = unit_costs(CARD, HW, replace(BASE, fp8=True)).layer
    cast_f = fp8["t_f"] - fp8_gemm_ms(lin, HW) - gemm_ms(core, HW) - elem_f
    assert cast_f > 0 and fp8["t_w"] == pytest.approx(fp8_gemm_ms(lin, HW))
    with pytest.raises(ProblemError, match="no FP8 peak"):
        unit_costs(CARD, load_hardware_card("a100-80gb"), replace(BASE, fp8=True))


def test_context_parallelism_halves_a_layer_and_fsdp_shards_the_state() -> None:
    one = unit_costs(CARD, HW, BASE).layer
    two = unit_costs(CARD, HW, replace(BASE, cp=2)).layer
    assert two["m_b"] == pytest.approx(one["m_b"] / 2)
    assert two["t_f"] >= one["t_f"] / 2 and two["t_w"] == pytest.approx(one["t_w"] / 2)
    sharded = replace(BASE, dp_shard=8)
    assert sharded.dp == 8 and sharded.dp_replicate == 1 and sharded.gpus == 8
    profile = pp_opt.profile_job(sharded, model=CARD, hardware=HW)
    params = profile.stages[0].params
    assert profile.static[0] >= sharded_state_bytes(params, shard=8)


def test_job_checks_name_the_field_and_the_fix() -> None:
    with pytest.raises(ProblemError, match="dp_replicate"):
        Job(pp=1, microbatches=1, seq=8, dp=8, dp_shard=2, dp_replicate=2)
    with pytest.raises(ProblemError, match="add --compile"):
        Job(pp=1, microbatches=1, seq=8, async_tp=True)
    with pytest.raises(ProblemError, match="cp"):
        Job(pp=1, microbatches=1, seq=10, cp=4)


def test_pure_fsdp_predicts_one_stage_and_its_exposed_communication() -> None:
    got = pp_opt.predict(model=CARD, hardware=HW, gpus=8, global_batch=16, seq=8192,
                         dp_shard=8, mbs=2, schedule="1F1B", ac="selective_op")  # fmt: skip
    stage = pp_opt.profile_job(replace(BASE, dp_shard=8, ac="selective_op"),
                               model=CARD, hardware=HW).stages[0]  # fmt: skip
    assert got.iteration_makespan == pytest.approx(stage.t_f + stage.t_b + stage.t_w)
    assert got.step_time == pytest.approx(
        got.iteration_makespan + got.dp_sync + got.optimizer_step  # type: ignore[operator]
    )
    assert got.tokens_per_s_per_gpu == pytest.approx(16 * 8192 / (got.step_time / 1e3) / 8)  # type: ignore[operator]
    assert len(got.peak_memory) == 1


def test_predict_cli_writes_the_file_and_refuses_degrees_that_miss_the_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["predict", "--model", "llama3-8b", "--hardware", "h100-96gb-500w",
             "--global-batch", "16", "--seq", "8192", "--dp-shard", "8", "--mbs", "2",
             "--schedule", "1F1B", "--ac", "selective_op", "--compile"]  # fmt: skip
    code, _, err = run([*flags, "--gpus", "6"], capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "--gpus" in err
    code, _, err = run([*flags, "--gpus", "8", "--schedule", "Nope"], capsys)
    assert code == 1 and "--schedule" in err
    out = tmp_path / "pred.json"
    code, text, err = run([*flags, "--gpus", "8", "-o", str(out)], capsys)
    assert code == 0, err
    data = json.loads(out.read_text())
    assert data["format"] == "pp-opt.prediction" and data["version"] == 1
    for key in ("config", "step_time", "tokens_per_s_per_gpu", "mfu", "peak_memory", "status",
                "gap"):  # fmt: skip
        assert key in data
    assert "TPS/GPU" in text
    # a configuration that does not fit: why, its file, and exit 2 (infeasible)
    code, text, _ = run([*flags, "--gpus", "8", "--ac", "none", "-o", str(out)], capsys)
    assert code == 2 and "1F1B needs" in text and "GiB usable on pipeline rank 0" in text
    assert json.loads(out.read_text())["status"] == "infeasible"


def test_bench_published_predicts_table5_1f1b_within_15_percent() -> None:
    spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts/bench_published.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_published"] = bench
    spec.loader.exec_module(bench)
    [result] = bench.evaluate_rows(bench.load_rows(["table5-1f1b"]))
    assert result["microbatches"] == 8 and result["stages_per_rank"] == 1
    assert 0.85 <= result["tps_ratio"] <= 1.15
    assert 0.85 <= result["memory_ratio"] <= 1.15


def test_the_plan_space_takes_the_allowed_features() -> None:
    from pp_opt.planner.config import Pins, PlanInputs
    from pp_opt.planner.space import enumerate_configs

    card = load_model_card("llama3.1-405b")
    inputs = PlanInputs(model=card, hardware=HW, gpus=512, global_batch=256, seq=8192)
    pins = Pins(tp=(8,), pp=(8,), dp_shard=(8, 3), ac=("full", "none"), mbs=(4,), v=(1, 2),
                placement=("loop",), fp8=True, compile=True, async_tp=True, recompute=False,
                offload=False)  # fmt: skip
    found = enumerate_configs(inputs, pins)
    assert found.skipped["dp_shard does not divide dp"] == 1
    jobs = [c.job for c in found.configs]
    assert len(jobs) == 4  # v 1, 2 x ac full, none
    for job in jobs:
        assert (job.dp, job.dp_shard, job.dp_replicate, job.microbatches) == (8, 8, 1, 8)
        assert job.fp8 and job.fp8_all_gather and job.compile and job.async_tp
        assert not job.optimizer_sharding
    assert {j.ac for j in jobs} == {"full", "none"}


def test_static_memory_of_per_token_buffers_says_to_cut_the_tokens() -> None:
    """At 131072 tokens a microbatch's fp32 loss over a 128k vocabulary dwarfs the sharded
    weights (torchtitan 9dec370's whole-microbatch loss): the fix named is fewer tokens per
    GPU, not more pipeline stages."""
    got = pp_opt.predict(model="llama3-8b", hardware="h100-96gb-500w", gpus=8, global_batch=8,
                         seq=131072, dp_shard=8, schedule="1F1B", ac="selective_op",
                         stack="torchtitan-2412")  # fmt: skip
    assert got.status == "infeasible"
    assert "(loss " in got.note and "a smaller mbs), a larger cp or tp" in got.note


@pytest.mark.parametrize(
    ("stack", "degrees", "field"),
    [("torchtitan", {"dp_replicate": 4, "dp_shard": 2}, "ep"),
     ("automodel", {"dp_replicate": 8}, "dp_shard"),
     ("megatron-core", {"dp_replicate": 8}, None)],
)  # fmt: skip
def test_predict_refuses_an_expert_layout_its_stack_cannot_run(
    stack: str, degrees: dict[str, int], field: str | None
) -> None:
    """torchtitan's experts borrow only the FSDP shard group's ranks (dp_shard x cp x tp),
    AutoModel runs none under plain data parallelism, Megatron-Core borrows every rank."""
    args = dict(model="deepseek-v3-debug", hardware="h100-80gb", gpus=8, global_batch=8,
                seq=2048, ep=8, stack=stack, schedule="1F1B", **degrees)  # fmt: skip
    if field is None:
        assert pp_opt.predict(**args).step_time  # type: ignore[arg-type]
        return
    with pytest.raises(ProblemError) as err:
        pp_opt.predict(**args)  # type: ignore[arg-type]
    assert err.value.field == field and "\n" not in str(err.value)


def test_data_parallel_ranks_left_out_go_to_fsdp_or_to_replicas_as_the_stack_runs_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pp_opt.planner.predict import data_parallel_degrees

    assert data_parallel_degrees(16, {"tp": 2}, fsdp=True) == {
        "tp": 2, "pp": 1, "cp": 1, "dp_shard": 8, "dp_replicate": 1}  # fmt: skip
    assert data_parallel_degrees(16, {"tp": 2, "dp_replicate": 2}, fsdp=True)["dp_shard"] == 4
    megatron = data_parallel_degrees(16, {"pp": 2}, fsdp=False)
    assert (megatron["dp_shard"], megatron["dp_replicate"]) == (1, 8)
    with pytest.raises(ProblemError, match="dp_replicate = 6"):  # a given shard degree stays
        data_parallel_degrees(16, {"dp_shard": 6}, fsdp=True)
    with pytest.raises(ProblemError, match="= 3; give degrees"):  # 3 does not divide 16
        data_parallel_degrees(16, {"cp": 3}, fsdp=True)
    common = dict(model="llama3-8b", hardware="h100-96gb-500w", gpus=8, global_batch=16,
                  seq=8192, mbs=2, ac="selective_op")  # fmt: skip
    inferred = pp_opt.predict(**common)
    assert inferred.to_dict()["config"] == pp_opt.predict(**common, dp_shard=8).to_dict()["config"]
    # the CLI names a Job field by its own flag, and a bad stack fails before any degree
    flags = ["predict", "--model", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "8",
             "--global-batch", "8", "--seq", "8192", "--dp-shard", "8"]  # fmt: skip
    code, _, err = run([*flags, "--stack", "nope"], capsys)
    assert code == 1 and err.startswith("error: --stack: nope: no such stack")


def test_recompute_modules_on_a_dense_decoder_are_refused_before_any_cost() -> None:
    common = dict(model="llama3-8b", hardware="h100-80gb", gpus=8, global_batch=16, seq=8192,
                  stack="megatron-core", ac="modules:layernorm")  # fmt: skip
    with pytest.raises(ProblemError, match="llama3-8b is a dense decoder") as err:
        pp_opt.predict(**common)
    assert err.value.field == "ac"
    pins = pp_opt.Pins(ac=("modules:layernorm",), stack="megatron-core")
    with pytest.raises(ProblemError, match="dense decoder"):  # the plan's screen, the same line
        pp_opt.plan(model="llama3-8b", hardware="h100-80gb", gpus=8, global_batch=16, seq=8192,
                    pins=pins, time_limit=5)  # fmt: skip


def test_a_solved_prediction_splits_layers_evenly_or_else_as_torchtitan_does() -> None:
    from pp_opt.frameworks.torchtitan import default_layers

    common = dict(hardware="a100-80gb", gpus=4, global_batch=8, seq=1024, pp=4, ac="full",
                  time_limit=2)  # fmt: skip
    assert pp_opt.predict(model="llama2-7b", **common).config["layers"] == [8, 8, 8, 8]
    uneven = pp_opt.predict(model="zb-1.5b", **common).config["layers"]  # 22 layers
    assert uneven == list(default_layers(22, 4)) and sum(uneven) == 22


def test_of_equal_schedules_the_solve_keeps_the_one_with_less_memory() -> None:
    """One stage, four microbatches: every order has the same makespan, and 1F1B's holds one
    microbatch where all-forwards-first holds four; the solve returns the lighter one."""
    common = dict(model="llama3-8b", hardware="h100-80gb", gpus=64, global_batch=256,
                  seq=8192, dp_shard=64, ac="selective_op", time_limit=5)  # fmt: skip
    solved, classic = pp_opt.predict(**common), pp_opt.predict(**common, schedule="1F1B")
    assert solved.step_time == pytest.approx(classic.step_time)
    assert solved.peak_memory[0] == pytest.approx(classic.peak_memory[0])
