"""One job type and one cost profile: the same costs whichever command or function asks."""

from __future__ import annotations

import importlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
from cli_helpers import run

import pp_opt
from pp_opt.errors import ProblemError
from pp_opt.frameworks.torchtitan import default_layers as torchtitan_default_layers
from pp_opt.job import Job, microbatch_count
from pp_opt.planner.config import Candidate, PlanInputs
from pp_opt.planner.predict import prediction_job
from pp_opt.planner.problems import candidate_problem, candidate_profile
from pp_opt.problem_io import load_problem, problem_from_costs
from pp_opt.profiler import (
    CostProfile,
    load_hardware_card,
    load_model_card,
    problem_from_profile,
    profile_costs,
    profile_job,
    profile_problem,
)

SEVENTY_B = dict(tp=4, pp=8, microbatches=32, seq=4096, placement="v", v=2)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        (dict(pp=0), "pp"),
        (dict(tp=True), "tp"),
        (dict(placement="zigzag"), "placement"),
        (dict(ac="all"), "ac"),
        (dict(layers=(1, 2, 3)), "layers"),
        (dict(bytes_per_param=-1.0), "bytes_per_param"),
        (dict(microbatches=20_000), "m"),
    ],
)
def test_a_bad_job_names_its_field(fields: dict[str, object], field: str) -> None:
    values: dict[str, object] = dict(pp=4, microbatches=8, seq=512)
    values.update(fields)
    with pytest.raises(ProblemError) as err:
        Job(**values)  # type: ignore[arg-type]
    assert err.value.field == field and "\n" not in str(err.value)


def test_the_v_placement_has_two_chunks() -> None:
    job = Job(pp=4, microbatches=8, seq=512, placement="v")
    assert job.v == 2 and job.stages == 8 and job.stage_devices[:5] == (0, 1, 2, 3, 3)


def test_a_cost_profile_is_its_file_and_its_problem() -> None:
    job = Job(pp=4, v=2, microbatches=8, seq=2048, tp=2)
    profile = profile_job(job, model="llama3-8b", hardware="h100-80gb")
    data = profile.to_dict()
    assert data == profile_costs(model="llama3-8b", hardware="h100-80gb", pp=4, v=2, tp=2,
                                 microbatches=8, seq=2048)  # fmt: skip
    again = CostProfile.from_dict(json.loads(json.dumps(data)))
    assert again.to_dict() == data
    assert again.job == replace(profile.job, bytes_per_param=16.0)  # the file keeps it resolved
    problem = problem_from_profile(profile)
    assert problem == problem_from_costs(data) == problem_from_profile(again)
    assert [s.t_f for s in problem.stages] == [st.t_f for st in profile.stages]


def test_profile_solve_plan_and_the_api_give_the_same_stage_costs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Once 20.67 ms (profile, no tensor-parallel collectives) against 23.50 ms (plan).
    out = tmp_path / "costs.json"
    flags = ["--tp", "4", "--pp", "8", "--microbatches", "32", "--seq", "4096",
             "--placement", "v", "--v", "2"]  # fmt: skip
    code, _, err = run(["profile", "--model", "llama3-70b", "--hardware", "h100-80gb",
                        *flags, "-o", str(out)], capsys)  # fmt: skip
    assert code == 0, err
    cli = load_problem(out)
    api = profile_problem(model="llama3-70b", hardware="h100-80gb", **SEVENTY_B)  # type: ignore[arg-type]
    card, hw = load_model_card("llama3-70b"), load_hardware_card("h100-80gb")
    inputs = PlanInputs(model=card, hardware=hw, gpus=32, global_batch=32, seq=4096)
    job = Job(dp=1, mbs=1, layers=(5,) * 16, **SEVENTY_B)  # type: ignore[arg-type]
    candidate = Candidate(job=job, recompute=False, offload=False)
    planned = candidate_problem(candidate, candidate_profile(inputs, candidate))
    # predict pins the same job from its flags and evaluates it as the plan does
    pinned = prediction_job(
        card, gpus=32, global_batch=32, seq=4096, tp=4, pp=8, cp=1, dp_shard=1, dp_replicate=1,
        mbs=1, schedule="pp_opt", v=2, placement="v", layers=(5,) * 16, ac="none", fp8=False,
        compile=False, async_tp=False, fp8_all_gather=None,
    )  # fmt: skip
    assert pinned == job
    predicted = Candidate(job=pinned, recompute=False, offload=False)
    via_predict = candidate_problem(predicted, candidate_profile(inputs, predicted))
    for problem in (api, planned, via_predict):
        assert [s.t_f for s in problem.stages] == pytest.approx([s.t_f for s in cli.stages])
        assert [s.t_b for s in problem.stages] == pytest.approx([s.t_b for s in cli.stages])
    # 23.49 ms before Llama layers' elementwise passes were counted op by op (issue 27);
    # 19.41 ms with the attention core at the GEMM rate, not FlashAttention-2's
    assert cli.stages[1].t_f == pytest.approx(19.42, abs=0.01)


def test_the_readme_names_are_exported() -> None:
    for name in ("Job", "CostProfile", "Pins", "PlanInputs", "profile_job", "plan",
                 "problem_from_profile", "problem_with_overrides"):  # fmt: skip
        assert name in pp_opt.__all__ and getattr(pp_opt, name) is not None
    # the function pp_opt.plan no longer hides the planner package
    assert importlib.import_module("pp_opt.planner.config").Candidate is pp_opt.Candidate


def test_the_microbatch_count_is_whole_or_names_the_batch() -> None:
    assert microbatch_count(global_batch=32, dp=4, mbs=2) == 4
    with pytest.raises(ProblemError) as err:
        microbatch_count(global_batch=30, dp=4, mbs=2)
    assert err.value.field == "global_batch" and "multiple of dp x mbs = 8" in str(err.value)
    for field in ("global_batch", "dp", "mbs"):  # zero was a ZeroDivisionError
        with pytest.raises(ProblemError) as err:
            microbatch_count(**({"global_batch": 32, "dp": 4, "mbs": 2} | {field: 0}))
        assert err.value.field == field
    with pytest.raises(ProblemError) as err:
        Job(pp=2, microbatches=4, seq=128, layers=(3, -1))
    assert err.value.field == "layers"
    assert microbatch_count(global_batch=32, dp=4, mbs=2, grad_accum=2) == 2
    with pytest.raises(ProblemError) as err:
        microbatch_count(global_batch=32, dp=4, mbs=2, grad_accum=3)
    assert "multiple of dp x mbs x grad_accum = 24" in str(err.value)


def test_gradient_accumulation_runs_the_schedule_again_in_the_same_memory() -> None:
    """``grad_accum`` schedules of the per-schedule batch, each ending in its gradient
    reduction, then one optimizer step: the step is ``ga x (makespan + dp_sync) + optimizer``
    of the smaller batch's schedule, its memory that schedule's, its tokens all of them
    (AutoModel's DeepSeek-V3 on 1024 H100 ran GA 4, Kimi K2 GA 2)."""
    common = dict(model="llama2-7b", hardware="h100-80gb", gpus=8, seq=2048, pp=4,
                  dp_shard=2, schedule="1F1B")  # fmt: skip
    one = pp_opt.predict(global_batch=16, **common)  # type: ignore[arg-type]
    three = pp_opt.predict(global_batch=48, grad_accum=3, **common)  # type: ignore[arg-type]
    assert three.config["microbatches"] == one.config["microbatches"] == 8
    assert three.config["grad_accum"] == 3 and "grad_accum" not in one.config
    assert three.peak_memory == one.peak_memory
    assert three.step_time == pytest.approx(
        3 * (one.iteration_makespan + one.dp_sync) + one.optimizer_step
    )
    assert three.tokens_per_s_per_gpu == pytest.approx(48 * 2048 / (three.step_time / 1e3) / 8)
    assert three.tokens_per_s_per_gpu > one.tokens_per_s_per_gpu  # the optimizer runs once


def _pinned(schedule: str, placement: str = "loop", v: int | None = None) -> Job:
    card = load_model_card("llama2-7b")
    return prediction_job(
        card, gpus=4, global_batch=16, seq=2048, tp=1, pp=4, cp=1, dp_shard=1, dp_replicate=1,
        mbs=2, schedule=schedule, v=v, placement=placement, layers=None, ac="none",
        fp8=False, compile=False, async_tp=False, fp8_all_gather=None,
    )  # fmt: skip


def test_a_pytorch_schedule_gets_torchtitans_stages_per_rank_and_split() -> None:
    assert _pinned("1F1B").v == 1 and _pinned("1F1B").microbatches == 8
    looped = _pinned("Interleaved1F1B")
    assert (looped.v, looped.placement) == (2, "loop")
    assert looped.layers == torchtitan_default_layers(32, 8)
    assert _pinned("ZBVZeroBubble", placement="v").v == 2
    assert _pinned("pp_opt").v == 1 and _pinned("pp_opt", placement="v").v == 2
    for schedule, placement in (("ZBVZeroBubble", "loop"), ("1F1B", "v")):
        with pytest.raises(ProblemError) as err:
            _pinned(schedule, placement)
        assert err.value.field == "schedule" and "placement" in str(err.value)


def test_solve_from_cards_takes_the_job_fields_and_refuses_them_with_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``solve --model`` profiles the job ``profile`` would (its stack, experts, overlap)."""
    base = ["solve", "--model", "deepseek-v3-debug", "--hardware", "h100-80gb", "--pp", "2",
            "--microbatches", "4", "--seq", "4096", "--time-limit", "2", "--quiet"]  # fmt: skip
    outputs = {}
    experts = ["--stack", "megatron-core", "--ep", "2", "--dp-replicate", "2", "--overlap"]
    for name, extra in (("plain", []), ("experts", experts)):
        out = tmp_path / f"{name}.json"
        code, _, err = run([*base, *extra, "-o", str(out)], capsys)
        assert code == 0, err
        outputs[name] = json.loads(out.read_text())["problem"]
    assert outputs["experts"]["stages"] != outputs["plain"]["stages"]
    assert outputs["experts"].get("pairs") and not outputs["plain"].get("pairs")
    problem = tmp_path / "p.json"
    problem.write_text(json.dumps(outputs["plain"]))
    code, _, err = run(["solve", str(problem), "--stack", "megatron-core", "--quiet"], capsys)
    assert code != 0 and "stack" in err and "--model" in err and "\n" not in err.strip()
