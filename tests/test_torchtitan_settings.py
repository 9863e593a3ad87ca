"""torchtitan settings by release, the fused-backward CSV and its cost, and what
``pp-opt plan`` writes (and claims) for torchtitan."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run

from pp_opt.errors import ProblemError
from pp_opt.export.fused import fused_backward_schedule
from pp_opt.export.torch_csv import torch_csv_rows
from pp_opt.export.torchtitan import (
    torchtitan_config_file,
    torchtitan_flags,
    torchtitan_settings,
)
from pp_opt.job import Job, microbatch_count
from pp_opt.ops import OpKey, OpKind
from pp_opt.orders.common import SPLIT, compute_order
from pp_opt.orders.patterns.classic import one_f_one_b
from pp_opt.problem import uniform_problem
from pp_opt.schedule import Schedule
from pp_opt.simulator import simulate

LAYERS = [8, 9, 8, 7]


def _settings(**changes: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(pp=4, v=1, placement="loop", mbs=2, layers=LAYERS, n_layers=32,
                                schedule_csv="best.csv", seq=8192, global_batch=16)  # fmt: skip
    args |= changes
    rest = {key: args.pop(key) for key in ("n_layers", "schedule_csv", "schedule_name",
                                           "split_backward", "version") if key in args}  # fmt: skip
    m = microbatch_count(global_batch=args.pop("global_batch"), dp=args.get("dp", 1),
                         mbs=args["mbs"])  # fmt: skip
    job = Job(microbatches=m, **args | {"layers": tuple(args["layers"])})
    return torchtitan_settings(job, **rest)


def test_release_0_3_reads_sequences_and_the_microbatch_size() -> None:
    s = _settings()
    assert s["parallelism"]["pipeline_parallel_microbatch_size"] == 2
    assert s["parallelism"]["pipeline_parallel_schedule"] == "PipelineScheduleSingle"
    assert s["parallelism"]["module_fqns_per_model_part"][-1][-2:] == ["norm", "lm_head"]
    # m = 16 / (1 x 2) = 8 microbatches of 2: the local batch is all of them.
    assert s["training"] == {"local_batch_size": 16, "global_batch_size": 16, "seq_len": 8192,
                             "disable_cuda_graphs": True}  # fmt: skip


def test_next_release_counts_microbatches_and_tokens() -> None:
    s = _settings(version="next", dp=2, global_batch=32)
    assert s["parallelism"]["num_pp_microbatches"] == 8  # 32 / (2 x 2)
    assert "pipeline_parallel_microbatch_size" not in s["parallelism"]
    assert s["training"]["num_tokens_per_microbatch_per_dp_rank"] == 2 * 8192
    assert s["training"]["num_tokens_per_train_step"] == 32 * 8192
    assert s["training"]["max_context_length"] == 8192


def test_a_job_without_a_pipeline_has_no_pipeline_key() -> None:
    s = _settings(pp=1, layers=[32], tp=2, global_batch=16)
    flags = " ".join(torchtitan_flags(s))
    assert "pipeline" not in flags and "module_fqns" not in flags and "cuda_graphs" not in flags
    assert s["parallelism"] == {"tensor_parallel_degree": 2, "data_parallel_shard_degree": 1}
    assert s["training"]["local_batch_size"] == 2  # one microbatch; 8 accumulation steps


def test_refused_names_say_which_name_to_use() -> None:
    with pytest.raises(ProblemError) as err:
        _settings(schedule_name="_PipelineScheduleRuntime")
    assert "PipelineScheduleMulti" in str(err.value) and "\n" not in str(err.value)


def test_selective_checkpointing_refuses_a_split_backward() -> None:
    with pytest.raises(ProblemError) as err:
        _settings(split_backward=True, ac="selective")
    assert err.value.field == "torchtitan_activation_checkpoint"
    assert "--fused-backward" in str(err.value)
    fused = _settings(ac="selective")
    assert fused["activation_checkpoint_value"] == "SelectiveAC.Config()"
    with pytest.raises(ProblemError):  # ZBVZeroBubble splits the backward itself
        _settings(v=2, placement="v", layers=[4] * 8, schedule_csv=None,
                  schedule_name="ZBVZeroBubble", ac="selective")  # fmt: skip


def test_flags_and_config_file_set_the_same_fields() -> None:
    s = _settings(v=2, placement="v", layers=[4] * 8)
    flags = torchtitan_flags(s)
    assert flags[-1] == "activation-checkpoint:none"  # a subcommand: last on the line
    at = flags.index("--parallelism.module_fqns_per_model_part")
    assert flags[at + 1] == "tok_embeddings,layers.0,layers.1,layers.2,layers.3"
    text = torchtitan_config_file(s, base="torchtitan.models.llama3.config_registry:llama3_8b",
                                  title="test")  # fmt: skip
    compile(text, "tt.py", "exec")
    for section in ("parallelism", "training"):
        for key, value in s[section].items():
            assert f"config.{section}.{key} = {value!r}" in text
    assert "config.activation_checkpoint = None" in text


# ---------------------------------------------------------------- fused backward


def _split_1f1b() -> Schedule:
    """1F1B with each backward split into B then W at once (p = 4, m = 8, t_w = 0.5)."""
    problem = uniform_problem(p=4, m=8, t_w=0.5, m_w=0.4, t_comm=0.0)
    fused = one_f_one_b(problem)
    per_device = []
    for device in range(problem.p):
        ops: list[OpKey] = []
        for key in fused.streams[(device, next(iter(fused.streams))[1])]:
            if key.kind is OpKind.BW:
                ops += [OpKey(OpKind.B, key.stage, key.microbatch),
                        OpKey(OpKind.W, key.stage, key.microbatch)]  # fmt: skip
            else:
                ops.append(key)
        per_device.append(ops)
    return simulate(compute_order(problem, per_device, SPLIT, "split 1f1b"))


def test_fused_csv_puts_b_at_the_i_and_drops_w() -> None:
    schedule = _split_1f1b()
    split = torch_csv_rows(schedule)
    fused = torch_csv_rows(schedule, fused_backward=True)
    for a, b in zip(split, fused, strict=True):
        assert b == [c.replace("I", "B") for c in a if "W" not in c]
    with pytest.raises(ProblemError):
        torch_csv_rows(schedule, format="compute_comms", fused_backward=True)


def test_fused_cost_is_the_fused_1f1b_makespan() -> None:
    schedule = _split_1f1b()
    cost = fused_backward_schedule(schedule)
    problem = schedule.problem
    st = problem.stages[0]
    # Uniform 1F1B without communication: (m + p - 1) (t_f + t_b + t_w).
    assert cost.fused_makespan == pytest.approx((problem.m + problem.p - 1)
                                                * (st.t_f + st.t_b + st.t_w))  # fmt: skip
    assert cost.added == pytest.approx(cost.fused_makespan - schedule.metrics.makespan)
    assert not cost.violations


# ---------------------------------------------------------------- pp-opt plan


TINY = """name = "tiny"
layers = 4
hidden = 256
heads = 4
vocab = 1024
seq = 128
"""


def _plan(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    (tmp_path / "tiny.toml").write_text(TINY)
    code, out, err = run(["plan", "--model", str(tmp_path / "tiny.toml"), "--hardware",
                          "h100-80gb", "--global-batch", "8", "--mbs", "1", "--time-limit", "8",
                          "--workers", "1", "-q", "-o", str(tmp_path / "plan.json"),
                          *extra], capsys)  # fmt: skip
    return code, out + err


def test_plan_without_a_pipeline_prints_no_pipeline_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, text = _plan(tmp_path, capsys, "--gpus", "1", "--pp", "1", "--no-offload",
                       "--no-recompute", "--torch-csv", str(tmp_path / "best.csv"))  # fmt: skip
    assert code == 0, text
    assert "pipeline_parallel" not in text and "module_fqns" not in text
    assert "torchtitan 0.3 flags" in text and "--training.local_batch_size 1" in text


def test_plan_writes_a_config_file_and_a_fused_csv_for_selective_checkpointing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "tt_job.py"
    code, text = _plan(tmp_path, capsys, "--gpus", "2", "--pp", "2", "--v", "2", "--placement",
                       "loop", "--no-offload", "--no-recompute", "--activation-checkpoint",
                       "selective", "--torch-csv", str(tmp_path / "best.csv"),
                       "--torchtitan-config", str(config), "--torchtitan-base",
                       "my.configs:tiny_job")  # fmt: skip
    assert code == 0, text
    training = json.loads((tmp_path / "plan.json").read_text())["training"]
    rows = (tmp_path / "best.csv").read_text()
    assert training["backward"] != "split"  # selective checkpointing cannot run one
    if training["backward"] == "fused":
        assert "W" not in rows and "I" not in rows
        assert "cannot run a split backward" in text and "predicted step" in text
    assert "from my.configs import tiny_job as _base" in config.read_text()
    assert f"--module {config.stem} --config pp_opt_plan" in text
    assert f"wrote {config}" in text


def test_an_infeasible_plan_writes_and_claims_no_schedule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv, schedule = tmp_path / "best.csv", tmp_path / "best.json"
    code, out, err = run(["plan", "--model", "llama3-70b", "--hardware", "a100-80gb",
                          "--gpus", "1", "--global-batch", "1", "--time-limit", "3",
                          "--workers", "1", "-q", "-o", str(tmp_path / "plan.json"),
                          "--torch-csv", str(csv), "--schedule", str(schedule)],
                         capsys)  # fmt: skip
    assert code == 2
    assert not csv.exists() and not schedule.exists()
    assert f"wrote {csv}" not in out and f"wrote {schedule}" not in out
    assert "no schedule, CSV or config written" in err and "infeasible" in err


def test_an_offloading_best_names_the_best_without_offload(offload_schedule: Schedule) -> None:
    from test_plan import small_plan

    from pp_opt.planner.training import plan_training
    from pp_opt.schedule_io import schedule_to_dict

    plan = small_plan(workers=1)
    best = plan.candidates[0]
    faster = replace(best, schedule=schedule_to_dict(offload_schedule),
                     step_time=(best.step_time or 0.0) - 1.0)  # fmt: skip
    choice = plan_training(replace(plan, candidates=[faster, *plan.candidates]))
    assert choice.scored is best
    notes = " ".join(choice.settings["notes"])
    assert "offloads" in notes and "pp_opt.runtime" in notes
    assert f"{best.step_time:.1f} ms (+1.0 ms)" in notes
    assert f"the best plan torchtitan 0.3 runs: {best.candidate.label()}" in notes


def test_export_fused_backward_says_what_it_costs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], loop_schedule: Schedule
) -> None:
    from pp_opt.schedule_io import save_schedule

    save_schedule(loop_schedule, tmp_path / "s.json")
    out = tmp_path / "s.csv"
    code, text, err = run(["export", str(tmp_path / "s.json"), "--format", "torch-csv",
                           "--fused-backward", "-o", str(out)], capsys)  # fmt: skip
    assert code == 0, err
    assert "fused backward" in text and "predicted makespan" in text
    assert all("W" not in cell and "I" not in cell for cell in out.read_text().split(","))
    code, _, err = run(["export", str(tmp_path / "s.json"), "--format", "trace",
                        "--fused-backward", "-o", str(tmp_path / "t.json")], capsys)  # fmt: skip
    assert code != 0 and "fused_backward" in err.replace("-", "_")


def test_framework_defaults_come_from_the_schedule_facts() -> None:
    from pp_opt.frameworks import megatron, pytorch, torchtitan

    assert pytorch.INTERLEAVED_SCHEDULES == (
        "Interleaved1F1B",
        "LoopedBFS",
        "InterleavedZeroBubble",
    )
    assert pytorch.V_SCHEDULES == ("ZBVZeroBubble", "DualPipeV")
    per_rank = {
        name: torchtitan.default_stages_per_rank(name) for name in pytorch.PYTORCH_SCHEDULES
    }
    assert {name for name, v in per_rank.items() if v == 1} == {"GPipe", "1F1B"}
    assert set(per_rank.values()) == {1, 2}
    assert torchtitan.default_schedule(1) == torchtitan.DEFAULT_SCHEDULE == "1F1B"
    for v in (1, 2, 4):
        assert megatron.pipeline_schedule(v) == torchtitan.default_schedule(v)
        fits = pytorch.check_schedule_fits(torchtitan.default_schedule(v), placement="loop", v=v,
                                           with_csv=False)  # fmt: skip
        assert fits.runs_itself


def test_expert_parallelism_is_torchtitans_degree() -> None:
    """torchtitan 0.3.0 takes ``expert_parallel_degree`` from the ``dp_shard x cp x tp`` ranks
    and has no expert tensor parallelism."""
    s = _settings(dp=8, dp_shard=8, ep=4)
    assert s["parallelism"]["expert_parallel_degree"] == 4
    assert "expert_parallel_degree" not in _settings()["parallelism"]
    for changes, field in ((dict(dp=8, dp_replicate=8, ep=4), "ep"),
                           (dict(dp=8, dp_shard=8, ep=4, etp=2), "etp")):  # fmt: skip
        with pytest.raises(ProblemError) as err:
            _settings(**changes)
        assert err.value.field == field


def test_the_data_and_context_parallel_degrees_are_written_out() -> None:
    """Left out, torchtitan gives every rank tp x pp leaves to FSDP: a plain data-parallel
    or context-parallel plan would run as another layout. A sharded optimizer beside
    replicated weights is Megatron's, not torchtitan's: refused by name."""
    assert _settings(dp=8, dp_shard=8)["parallelism"]["data_parallel_shard_degree"] == 8
    plain = _settings(dp=8)["parallelism"]  # dp_replicate follows: 8 replicas of no shard
    assert plain["data_parallel_shard_degree"] == 1 and plain["data_parallel_replicate_degree"] == 8
    hsdp = _settings(dp=8, dp_shard=4, cp=2, global_batch=32)["parallelism"]
    assert (hsdp["data_parallel_shard_degree"], hsdp["data_parallel_replicate_degree"],
            hsdp["context_parallel_degree"]) == (4, 2, 2)  # fmt: skip
    assert (
        "context_parallel_degree" not in plain
        and "data_parallel_replicate_degree" not in (_settings(dp=8, dp_shard=8)["parallelism"])
    )
    flags = " ".join(torchtitan_flags(_settings(dp=8, dp_shard=4, cp=2, global_batch=32)))
    assert "--parallelism.context_parallel_degree 2" in flags
    with pytest.raises(ProblemError) as err:
        _settings(dp=8, optimizer_sharding=True)
    assert err.value.field == "optimizer_sharding" and "dp_shard 8" in err.value.message
    from pp_opt.planner.training import _torchtitan_refusal

    zero = Job(pp=2, microbatches=4, seq=64, dp=8, optimizer_sharding=True)
    assert _torchtitan_refusal(zero).startswith("optimizer_sharding:")
    assert _torchtitan_refusal(Job(pp=2, microbatches=4, seq=64, dp=8)) == ""


def test_a_plan_torchtitan_cannot_run_is_named_not_exported() -> None:
    """torchtitan's expert ranks come from dp_shard x cp x tp only, and it has no module
    checkpointing: such a best plan gets a note and the next one the settings."""
    from pp_opt.planner.training import _torchtitan_refusal

    plain = Job(pp=2, microbatches=4, seq=64, dp=8, ep=8)
    assert _torchtitan_refusal(plain).startswith("ep:")
    assert _torchtitan_refusal(Job(pp=2, microbatches=4, seq=64, ac="modules:moe_act")).startswith(
        "ac:"
    )
    assert _torchtitan_refusal(Job(pp=2, microbatches=4, seq=64, dp=8, dp_shard=8, ep=8)) == ""


def test_a_plan_that_overlaps_on_torchtitan_says_the_release_does_not() -> None:
    from pp_opt.planner.training import _stack_notes

    notes = _stack_notes(Job(pp=2, microbatches=4, seq=64, overlap=True))
    assert len(notes) == 1 and "OVERLAP_F_B" in notes[0] and "in sequence" in notes[0]
    assert _stack_notes(Job(pp=2, microbatches=4, seq=64, overlap=True,
                            stack="megatron-core")) == []  # fmt: skip
    assert _stack_notes(Job(pp=2, microbatches=4, seq=64)) == []


def test_an_expert_parallel_job_turns_cuda_graphs_off() -> None:
    """torchtitan 0.3.0 refuses CUDA graphs with its all-to-all token dispatcher, pipeline or
    not."""
    s = _settings(pp=1, v=1, layers=[32], dp=8, dp_shard=8, ep=4, schedule_csv=None)
    assert any("cuda_graphs" in k for k in s["training"])
