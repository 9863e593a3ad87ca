"""Issue 40: what a plan searches and compares against by default (torchtitan's own
settings), and the memory term that makes a candidate infeasible."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from plan_helpers import ScoringExecutor

from pp_opt.errors import ProblemError
from pp_opt.frameworks import torchtitan as titan
from pp_opt.job import Job
from pp_opt.planner.baselines import baseline_candidates
from pp_opt.planner.config import Candidate, Pins, PlanInputs
from pp_opt.planner.evaluate import EvaluationTask, evaluate
from pp_opt.profiler.cards import GIB, load_hardware_card, load_model_card
from pp_opt.profiler.stacks import load_stack_card

T5 = dict(tp=8, pp=16, dp=4, mbs=2, microbatches=32, seq=8192, optimizer_sharding=True,
          fp8=True, compile=True, async_tp=True)  # fmt: skip
"""A plan's best on Table 5's job (512 GPUs, 256 sequences): plain data parallelism."""


def _best(**over: object) -> Candidate:
    return Candidate(job=Job(**{**T5, **over}), recompute=False, offload=False)  # type: ignore[arg-type]


def test_torchtitan_baselines_run_its_model_config() -> None:
    found = baseline_candidates(_best(), 126, model="llama3.1-405b")
    titan_jobs = [(order, c.job) for label, order, c in found if label == "torchtitan"]
    assert [(order, job.v) for order, job in titan_jobs] == [("1F1B", 1), ("Interleaved1F1B", 2)]
    for _, job in titan_jobs:
        # FSDP over the 4 data-parallel ranks, FullAC, microbatches of one: 256 / 4 = 64
        assert (job.dp, job.dp_shard, job.dp_replicate) == (4, 4, 1)
        assert (job.ac, job.mbs, job.microbatches) == ("full", 1, 64)
        assert not job.optimizer_sharding and job.fp8_all_gather
        assert (job.tp, job.pp, job.fp8, job.compile, job.async_tp) == (8, 16, True, True, True)
    assert titan_jobs[0][1].layers == titan.default_layers(126, 16)
    assert "megatron" not in [label for label, _, _ in found]  # 126 layers over 32 stages
    [megatron] = [c.job for label, _, c in baseline_candidates(_best(), 128) if label == "megatron"]
    assert (megatron.ac, megatron.dp_shard, megatron.mbs) == ("none", 1, 2)
    assert megatron.layers == (4,) * 32
    assert megatron.optimizer_sharding  # Megatron-LM's keeps the best's settings


def test_other_models_take_their_own_config_or_the_trainers() -> None:
    eight = baseline_candidates(_best(), 32, model="llama3-8b")[0][2].job
    assert eight.ac == "selective_op"  # llama3_8b: SelectiveAC, per op in 0.3.0
    other = baseline_candidates(_best(), 32, model="some-card")[0][2].job
    assert other.ac == "selective_op"  # Trainer.Config's default


def test_pinned_settings_stay_the_plans_own() -> None:
    pins = Pins(ac="none", mbs=(2,), dp_shard=(1,))
    job = baseline_candidates(_best(), 126, model="llama3.1-405b", pins=pins)[0][2].job
    assert (job.ac, job.mbs, job.microbatches, job.dp_shard) == ("none", 2, 32, 1)
    assert job.optimizer_sharding


@pytest.mark.parametrize(("model", "pp", "sequences", "mbs"), [
    ("llama3.1-405b", 16, 64, 1),  # a pipeline: pipeline_parallel_microbatch_size = 1
    ("llama3.1-405b", 1, 64, 2),  # no pipeline: local_batch_size 2
    ("llama3-70b", 1, 4, 4),  # local batch 8, more than the 4 sequences of a rank
    ("llama3-70b", 1, 12, 6),  # 8 does not divide 12: the largest that does below it
    ("some-card", 1, 16, 8),  # TrainingConfig's local_batch_size
])  # fmt: skip
def test_torchtitan_microbatch_size(model: str, pp: int, sequences: int, mbs: int) -> None:
    assert titan.default_microbatch_size(model, pp, sequences) == mbs


def test_bad_sequences_name_the_field() -> None:
    with pytest.raises(ProblemError, match="^sequences: "):
        titan.default_microbatch_size("llama3-8b", 1, 0)


def test_a_stack_card_names_the_modes_it_runs(tmp_path: Path) -> None:
    assert load_stack_card("torchtitan").ac_modes == ("none", "selective_op", "full")
    assert load_stack_card("megatron-core").ac_modes == ("none", "selective", "full")
    bad = tmp_path / "stack-bad.toml"
    bad.write_text('ac_modes = ["none", "sometimes"]\n')
    with pytest.raises(ProblemError, match="^stack.ac_modes: unknown 'sometimes'") as err:
        load_stack_card(str(bad))
    assert "\n" not in str(err.value)
    bad.write_text('ac_modes = "full"\n')
    with pytest.raises(ProblemError, match="^stack.ac_modes: got 'full'; give a list"):
        load_stack_card(str(bad))


def test_an_infeasible_candidate_names_its_largest_term() -> None:
    """Table 5's layout without checkpointing at 4 sequences per microbatch: 1F1B keeps 8 of
    them on rank 0, whose activations are far over the 96 GB card."""
    card, hw = load_model_card("llama3.1-405b"), load_hardware_card("h100-96gb-500w")
    inputs = PlanInputs(model=card, hardware=hw, gpus=512, global_batch=256, seq=8192)
    job = Job(**{**T5, "pp": 8, "dp": 8, "mbs": 4, "microbatches": 8, "dp_shard": 8,
                 "optimizer_sharding": False, "layers": titan.default_layers(126, 8)})  # fmt: skip
    candidate = Candidate(job=job, recompute=False, offload=False)
    for order in ("1F1B", "solve"):
        got = evaluate(EvaluationTask(inputs=inputs, candidate=candidate, order=order,
                                      time_limit=2.0, label="torchtitan"))  # fmt: skip
        assert got.status == "infeasible", got.note
        name, size, _, _, total, unit = got.largest_term.split()
        assert unit == "GiB"
        assert name == "activations"
        assert float(total) > hw.usable_bytes / GIB  # the peak is over what the card holds
        assert float(size) > 0.5 * float(total)
        assert got.to_dict()["largest_term"] == got.largest_term
    from pp_opt.planner.report import _over_memory, _row

    assert _row("", got)[-1] == f"infeasible: {got.largest_term}"
    lines = _over_memory([got, replace(got, status="timeout")])
    assert lines[0].startswith("out of memory (1;") and got.largest_term in lines[1]


def _scripted(script: dict[str, tuple[float, bool]]) -> ScoringExecutor:
    """Scores each candidate by a script: (step time, memory bound) per checkpointing mode;
    records the modes solved."""
    return ScoringExecutor(lambda job: script[job.candidate.job.ac],
                           lambda job: job.candidate.job.ac)  # fmt: skip


@pytest.mark.parametrize(("bound", "solved"), [(False, ["none"]), (True, ["none", "full"])])
def test_checkpointing_is_pruned_where_memory_does_not_bind(bound: bool, solved: list[str]) -> None:
    import time

    from pp_opt.planner.problems import Bounded
    from pp_opt.planner.search import PRUNED_BY_CHECKPOINTING, solve_survivors

    card, hw = load_model_card("llama3.1-405b"), load_hardware_card("h100-96gb-500w")
    inputs = PlanInputs(model=card, hardware=hw, gpus=512, global_batch=256, seq=8192)
    plain = _best(layers=(8,) * 15 + (6,))
    full = replace(plain, job=replace(plain.job, ac="full", layers=(7,) + (8,) * 14 + (7,)))
    runner = _scripted({"none": (100.0, bound), "full": (90.0, False)})
    found = solve_survivors(inputs, [Bounded(candidate=plain, step_bound=50.0),
                                     Bounded(candidate=full, step_bound=60.0)], runner,
                            short=5.0, deadline=time.perf_counter() + 60)  # fmt: skip
    assert runner.submitted == solved  # another split of the same configuration is its twin
    assert found.pruned[PRUNED_BY_CHECKPOINTING] == (0 if bound else 1)


def test_a_default_whose_weights_alone_overflow_is_infeasible_and_says_by_how_much() -> None:
    """torchtitan's default for DeepSeek-V3 at a plan's degrees (tp4 pp16, FSDP over 4
    ranks, ep 8) holds more weights, gradients and optimizer state than an 80 GB card: the
    default is infeasible (not an error) and shows the static bytes against the cap."""
    card, hw = load_model_card("deepseek-v3"), load_hardware_card("h100-80gb")
    inputs = PlanInputs(model=card, hardware=hw, gpus=256, global_batch=512, seq=4096)
    job = Job(tp=4, pp=16, dp_shard=4, ep=8, mbs=1, microbatches=128, seq=4096,
              stack="automodel", layers=titan.default_layers(card.layers, 16))  # fmt: skip
    got = evaluate(EvaluationTask(inputs=inputs, candidate=Candidate(job=job, recompute=False,
                                                                     offload=False),
                                  order="1F1B", time_limit=2.0, label="torchtitan"))  # fmt: skip
    assert got.status == "infeasible", got.note
    name, _, size, _, _, cap, _, usable = got.largest_term.split()
    assert usable == "usable"
    assert name == "static" and float(size) > float(cap) == pytest.approx(hw.usable_bytes / GIB)


def test_a_best_without_pipeline_is_compared_with_the_pipeline_defaults_too() -> None:
    """Llama 3.1 405B on 512 GPUs: the best may run FSDP x TP with no pipeline; the defaults
    then also take the best pipelined candidate's degrees, so that torchtitan's 1F1B and
    Interleaved1F1B are in the comparison."""
    from pp_opt.planner.evaluate import Scored
    from pp_opt.planner.pipeline import default_anchors

    def scored(step: float, **over: object) -> Scored:
        return Scored(candidate=_best(**over), order="solve", status="optimal",
                      step_time=step, peak_memory=[1.0], static_memory=0.5)  # fmt: skip

    flat = scored(1.0, pp=1, dp=64, microbatches=4, optimizer_sharding=False)
    deep, deeper = scored(2.0), scored(3.0, pp=8, dp=8, microbatches=32)
    assert default_anchors([flat, deep, deeper]) == [flat, deep]
    assert default_anchors([deep, flat]) == [deep]
    assert default_anchors([flat]) == [flat] and default_anchors([]) == []


def test_the_time_kept_for_the_defaults_covers_both_anchors_and_slow_evaluations() -> None:
    """The 405B plan's evaluations took 1.6 s (median) against 1.47 s screening limits, and
    the time kept for 6 default solves ran out after the one-stage best's own two: the
    pipelined defaults were dropped. The time kept counts both anchors' solves at what an
    evaluation takes, and leaves one anchor's worth after the first's round."""
    from pp_opt.planner.evaluate import Scored
    from pp_opt.planner.pipeline import ANCHOR_JOBS, BASELINE_JOBS, baseline_seconds

    def took(seconds: float) -> Scored:
        return Scored(candidate=_best(), order="solve", status="optimal", seconds=seconds)

    assert BASELINE_JOBS == ANCHOR_JOBS + 2
    search = [took(0.2), took(1.6), took(10.0)]
    assert baseline_seconds(search, 1.47, BASELINE_JOBS, 2) == pytest.approx(1.2 * 1.6 * 4)
    assert baseline_seconds([], 1.47, BASELINE_JOBS, 2) == pytest.approx(1.2 * 1.47 * 4)
    first_round = 1.2 * 1.6  # the one-stage best's two defaults, one round on 2 workers
    left = baseline_seconds(search, 1.47, BASELINE_JOBS, 2) - first_round
    assert left >= baseline_seconds(search, 1.47, ANCHOR_JOBS, 2) - 1e-9
