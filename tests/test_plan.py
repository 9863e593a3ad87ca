"""The planner end to end: pp_opt.plan, plan.json, the command line and the picture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run

import pp_opt
from pp_opt.planner import Pins, Plan, PoolExecutor
from pp_opt.planner.plot import pareto_front, plot_plan
from pp_opt.planner.search import PRUNED_BY_BOUND
from pp_opt.profiler.cards import model_card_from_dict
from pp_opt.schedule_io import schedule_from_dict
from pp_opt.validator import validate

TINY = {
    "layers": 6,
    "hidden": 512,
    "heads": 8,
    "vocab": 2048,
    "seq": 512,
    "mlp": "swiglu",
    "norm": "rmsnorm",
    "attention": "flash",
    "bias": False,
    "position": "rope",
    "kv_heads": 4,
    "ffn": 1536,
}
PINS = Pins(tp=(1, 2), pp=(2,), v=(1, 2), mbs=(1,), recompute=False, offload=False, ac="none",
            dp_shard=(1,))  # fmt: skip
"""Checkpointing and FSDP pinned off: the plan of these tests stays as small and fast as
its docstring says (unpinned, a plan also searches them)."""


def small_plan(**options: object) -> Plan:
    """A plan whose first five candidates are proved optimal in about a second each, so
    that every executor ranks them alike. The limit is ample: a loaded machine must not cut
    a screening solve (5 s each in one process, 10 s with two workers; the child process's
    start counts in them) or the screening short, or the executors would rank what each
    had time for: a cut solve is refined from its own schedule and ends at another of the
    problem's optimal schedules, with another peak and, through the gradient all-reduce's
    overlap, another step time. Seven candidates are solved (18 when ``keep`` is large);
    one of them (three of the 18) ends at a gap of about 1e-4, the rounding of CP-SAT's
    units (its model proved, :func:`pp_opt.solvers.cpsat.scaling.problem_bound`)."""
    card = model_card_from_dict(TINY, "tiny")
    return pp_opt.plan(
        model=card,
        hardware="h100-80gb",
        gpus=4,
        global_batch=8,
        pins=PINS,
        time_limit=150,
        **options,
    )  # type: ignore[arg-type]


def top(plan: Plan, count: int = 5) -> list[tuple[object, float]]:
    # proved: optimal, or the 1e-4 rounding gap of CP-SAT's units (small_plan's docstring)
    assert all(s.status == "optimal" or s.gap < 1e-3 for s in plan.candidates[:count])
    return [(s.candidate, round(s.step_time, 6)) for s in plan.candidates[:count]]  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def serial() -> Plan:
    return small_plan(workers=1)


def test_candidates_are_ranked_by_step_time(serial: Plan) -> None:
    ranked = serial.candidates
    assert len(ranked) >= 3
    assert [s.step_time for s in ranked] == sorted(s.step_time for s in ranked)  # type: ignore[type-var]
    for s in ranked:
        c = s.job
        assert c.tp * c.pp * c.dp == 4 and c.dp * c.mbs * c.m == 8
        assert sum(s.layers) == 6 and len(s.layers) == c.pp * c.v
        assert s.step_time == pytest.approx(s.iteration_makespan + s.dp_sync + s.optimizer_step)  # type: ignore[operator]
        assert 0 < s.mfu < 1 and max(s.peak_memory) <= 76 * 2**30  # type: ignore[operator]


def test_the_best_schedule_is_valid_and_scored_from_its_ops(serial: Plan) -> None:
    best = serial.best_schedule()
    assert best is not None and validate(best) == []
    assert best.metrics.makespan == serial.candidates[0].iteration_makespan


def test_every_candidate_is_evaluated_or_pruned(serial: Plan) -> None:
    data = serial.to_dict()
    counts = data["counts"]
    assert counts["candidates"] == counts["evaluated"] + counts["pruned"]
    assert counts["evaluated"] == len(data["candidates"]) + len(data["failed"])
    assert set(data["pruned"]) <= {PRUNED_BY_BOUND}  # small and fast: nothing runs out of time


def test_plan_json_has_the_documented_fields(serial: Plan, tmp_path: Path) -> None:
    data = json.loads(serial.save(tmp_path / "plan.json").read_text())
    assert data["format"] == "pp-opt.plan" and data["version"] == 1
    assert data["inputs"]["gpus"] == 4 and data["inputs"]["global_batch"] == 8
    first = data["candidates"][0]
    assert set(first["config"]) == {
        "tp",
        "pp",
        "dp",
        "v",
        "placement",
        "mbs",
        "m",
        "layers",
        "recompute",
        "offload",
        "optimizer_sharding",
    }
    for key in (
        "iteration_makespan",
        "dp_sync",
        "step_time",
        "tokens_per_s_per_gpu",
        "mfu",
        "peak_memory",
        "status",
        "gap",
    ):
        assert key in first
    assert schedule_from_dict(data["schedule"]).metrics.makespan == first["iteration_makespan"]
    names = [(b["name"], b["schedule"]) for b in data["baselines"]]
    assert ("torchtitan", "1F1B") in names and ("torchtitan", "pp_opt") in names


def test_the_defaults_use_the_same_costs(serial: Plan) -> None:
    by_name = {(b.label, b.order, b.candidate.layers): b for b in serial.baselines}
    own = by_name[("torchtitan", "1F1B", (3, 3))]  # (6 + 2) / 2 = 4 units each, less one
    solved = by_name[("torchtitan", "solve", (3, 3))]
    assert solved.iteration_makespan <= own.iteration_makespan + 1e-9  # type: ignore[operator]
    best = serial.candidates[0]
    assert best.step_time <= min(b.step_time for b in serial.baselines if b.ok) + 1e-9  # type: ignore[operator,type-var]


@pytest.mark.slow
def test_a_process_pool_gives_the_same_ranking(serial: Plan) -> None:
    pool = PoolExecutor(2)
    try:
        other = small_plan(executor=pool)
    finally:
        pool.close()
    assert top(other) == top(serial)


def test_the_picture_marks_the_pareto_front(serial: Plan) -> None:
    pytest.importorskip("matplotlib")
    front = pareto_front(serial.candidates)
    # the front starts at the best step time (of equal ones, at the leanest peak found)
    assert front[0].step_time == pytest.approx(serial.candidates[0].step_time, abs=1e-6)
    assert max(front[0].peak_memory) == min(
        max(s.peak_memory) for s in serial.candidates if s.step_time == front[0].step_time
    )
    assert all(
        max(a.peak_memory) > max(b.peak_memory) for a, b in zip(front, front[1:], strict=False)
    )
    ax = plot_plan(serial)
    assert ax.get_xlabel().startswith("peak memory") and len(ax.collections) >= 2


def test_the_command_line_writes_plan_schedule_and_picture(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    card = tmp_path / "tiny.toml"
    card.write_text(
        "".join(
            f"{k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}\n"
            for k, v in TINY.items()
        )
    )
    out = tmp_path / "plan.json"
    best = tmp_path / "best.json"
    code, stdout, _ = run(
        [
            "plan",
            "--model",
            str(card),
            "--hardware",
            "h100-80gb",
            "--gpus",
            "2",
            "--global-batch",
            "4",
            "--tp",
            "1",
            "--pp",
            "2",
            "--v",
            "1",
            "--mbs",
            "1",
            "--no-recompute",
            "--no-offload",
            "--time-limit",
            "10",
            "--workers",
            "1",
            "-o",
            str(out),
            "--schedule",
            str(best),
            "--torch-csv",
            str(tmp_path / "best.csv"),
            "--quiet",
        ],
        capsys,
    )
    assert code == 0, stdout
    assert "defaults on the same costs" in stdout and f"wrote {best}" in stdout
    assert json.loads(out.read_text())["candidates"][0]["config"]["pp"] == 2
    code, stdout, _ = run(["validate", str(best)], capsys)
    assert code == 0 and "valid" in stdout
    assert (tmp_path / "best.csv").read_text().count("\n") == 2  # one row per rank


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--pp", "3,x"], "error: --pp: got '3,x'; give integers separated by commas"),
        (["--placement", "zigzag"], "error: --placement: got 'zigzag'; give loop, v or loop,v"),
        (["--pp", "3", "--tp", "1"], "error: --gpus: no legal configuration"),
    ],
)
def test_bad_flags_are_one_line_errors(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(
        [
            "plan",
            "--model",
            "llama3-8b",
            "--hardware",
            "h100-80gb",
            "--gpus",
            "4",
            "--global-batch",
            "8",
            "-o",
            "/tmp/never-written.json",
            *flags,
        ],
        capsys,
    )
    assert code == 1 and err.startswith(message) and err.count("\n") == 1


def test_the_report_folds_candidates_that_differ_only_in_their_switches(serial: Plan) -> None:
    from dataclasses import replace

    from pp_opt.planner.report import plan_report

    best = serial.candidates[0]
    twin = replace(best, candidate=replace(best.candidate, offload=True))
    folded = replace(serial, candidates=[best, twin, *serial.candidates[1:]])
    text = plan_report(folded)

    def ranked_rows(report: str) -> int:
        return sum(line.lstrip()[:1].isdigit() for line in report.splitlines())

    assert "(+1 alike)" in text and ranked_rows(text) == ranked_rows(plan_report(serial))


def test_training_settings_name_the_split_and_the_degrees(serial: Plan) -> None:
    from pp_opt.planner.training import training_settings

    best = serial.candidates[0]
    settings = training_settings(best, n_layers=6, schedule_csv="best.csv")
    assert settings["layers"] == list(best.candidate.layers)
    torchtitan = settings["torchtitan"]
    assert torchtitan["parallelism"]["pipeline_parallel_degree"] == best.job.pp
    assert "--parallelism.pipeline_parallel_schedule_csv" in torchtitan["flags"]
    if best.job.placement == "v":
        assert "placement" in settings["megatron_note"]
    else:
        flags = settings["megatron"]
        assert flags[flags.index("--pipeline-model-parallel-size") + 1] == str(best.job.pp)
    assert serial.training["candidate"] == best.candidate.label()  # plan() fills it


def test_training_settings_of_an_fsdp_job_name_megatron_fsdp_and_its_environment(
    serial: Plan,
) -> None:
    """Megatron-FSDP asserts ``CUDA_DEVICE_MAX_CONNECTIONS`` is not 1: the settings say so
    beside its flags, and the report prints it; a job without FSDP gets neither."""
    from dataclasses import replace

    from pp_opt.planner.report import training_lines
    from pp_opt.planner.training import training_settings

    best = next(s for s in serial.candidates if s.job.placement != "v")
    plain = training_settings(best, n_layers=6)
    assert "megatron_env" not in plain
    job = replace(best.candidate.job, dp=2, dp_shard=2, dp_replicate=1)
    fsdp = replace(best, candidate=replace(best.candidate, job=job))
    settings = training_settings(fsdp, n_layers=6)
    assert "--use-megatron-fsdp" in settings["megatron"]
    assert settings["megatron_env"] == "unset CUDA_DEVICE_MAX_CONNECTIONS"
    assert any("unset CUDA_DEVICE_MAX_CONNECTIONS" in line for line in training_lines(settings))


def test_a_stop_request_ends_the_plan_with_what_was_solved() -> None:
    from pp_opt.planner.search import NOT_SOLVED_INTERRUPTED

    token = pp_opt.StopToken()
    token.request("interrupted by a test")
    stopped = small_plan(workers=1, stop=token)
    assert stopped.candidates == [] and stopped.baselines == []
    assert stopped.pruned[NOT_SOLVED_INTERRUPTED] > 0


def test_pruning_keeps_the_top_of_an_exhaustive_search(serial: Plan) -> None:
    exhaustive = small_plan(workers=1, keep=1000)  # every feasible candidate solved
    assert PRUNED_BY_BOUND not in exhaustive.pruned and PRUNED_BY_BOUND in serial.pruned
    assert len(exhaustive.candidates) > len(serial.candidates)
    assert top(exhaustive) == top(serial)


def test_training_settings_without_a_csv_name_the_one_to_write(serial: Plan) -> None:
    from pp_opt.planner.training import DEFAULT_CSV, training_settings

    settings = training_settings(serial.candidates[0], n_layers=6)
    parallelism = settings["torchtitan"]["parallelism"]
    assert parallelism["pipeline_parallel_schedule_csv"] == DEFAULT_CSV
    assert "--format torch-csv" in settings["schedule_csv_note"]


def test_the_defaults_take_the_degrees_of_the_best_after_refinement(monkeypatch) -> None:
    """A refinement that changes the best (here one that makes the last candidate the
    fastest) gives the defaults its degrees: they are compared with the plan's answer."""
    import pp_opt.planner.pipeline as pipeline
    from pp_opt.planner.evaluate import Scored

    def promote(inputs, found, executor, **options) -> None:  # type: ignore[no-untyped-def]
        ranked = sorted((s for s in found.scored if s.ok), key=Scored.sort_key)
        ranked[-1].step_time = ranked[0].step_time / 2

    asked = []

    def recorded(best, *args, **options):  # type: ignore[no-untyped-def]
        asked.append(best)
        return baseline_candidates(best, *args, **options)

    baseline_candidates = pipeline.baseline_candidates
    monkeypatch.setattr(pipeline, "refine", promote)
    monkeypatch.setattr(pipeline, "baseline_candidates", recorded)
    plan = small_plan(workers=1)
    assert plan.baselines and asked == [plan.candidates[0].candidate]
    assert plan.candidates[0].step_time < plan.candidates[1].step_time / 1.5


def test_time_left_after_the_search_prepares_and_solves_the_configurations_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Preparation stops at its share of the limit (a 405B plan left 916 configurations
    unsplit and finished at 300 s of 600); time left after the search and its refinement
    splits, bounds and solves them. Here preparation has no time at all."""
    import pp_opt.planner.pipeline as pipeline
    from pp_opt.planner.search import NOT_PREPARED

    monkeypatch.setattr(pipeline, "PREPARE_SHARE", 0.0)
    plan = small_plan(workers=1)
    assert plan.candidates and plan.candidates[0].ok
    assert NOT_PREPARED not in plan.pruned, plan.pruned
