"""``pp-opt plan``: the fastest configuration of a training job, ranked with its rivals."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from pp_opt.atomic import check_writable
from pp_opt.cli import exit_codes
from pp_opt.cli.output import say
from pp_opt.errors import ProblemError

if TYPE_CHECKING:
    from pp_opt.planner.search import PlanProgress


def _ints(flag_name: str, text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise ProblemError(flag_name, f"got {text!r}; give integers separated by commas") from None
    if not values or any(x < 1 for x in values):
        raise ProblemError(flag_name, f"got {text!r}; give integers of at least 1")
    return values


def _placements(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    values = tuple(x for x in text.replace(" ", "").split(",") if x)
    bad = [x for x in values if x not in ("loop", "v")]
    if not values or bad:
        raise ProblemError("placement", f"got {text!r}; give loop, v or loop,v")
    return values


def _modes(text: str | None) -> tuple[str, ...] | None:
    from pp_opt.job import ACTIVATION_CHECKPOINT_MODES

    if text is None:
        return None
    values = tuple(x for x in text.replace(" ", "").split(",") if x)
    bad = [x for x in values if x not in ACTIVATION_CHECKPOINT_MODES]
    if not values or bad:
        modes = ", ".join(ACTIVATION_CHECKPOINT_MODES)
        raise ProblemError("ac", f"got {text!r}; give some of {modes}, separated by commas")
    return values


def _progress(quiet: bool) -> Callable[[PlanProgress], None] | None:
    """One line per second at most, and whenever the best step time improves."""
    if quiet:
        return None
    shown: list[float | None] = [0.0, None]

    def show(p: PlanProgress) -> None:
        now = time.perf_counter()
        if now - (shown[0] or 0.0) < 1.0 and p.incumbent == shown[1]:
            return
        shown[0], shown[1] = now, p.incumbent
        best = "-" if p.incumbent is None else f"{p.incumbent:.1f} ms ({p.label})"
        say(f"{p.seconds:7.1f} s  done {p.done}  pruned {p.pruned}  of {p.total}  best {best}")

    return show


def plan(
    model: str = typer.Option(..., "--model", help="Model card TOML (or bundled name)."),
    hardware: str = typer.Option(..., "--hardware", help="Hardware card TOML (or name)."),
    gpus: int = typer.Option(..., "--gpus", help="GPUs in the job."),
    global_batch: int = typer.Option(..., "--global-batch", help="Sequences per step."),
    seq: int | None = typer.Option(None, "--seq", help="Sequence length (card default)."),
    output: Path = typer.Option(..., "-o", "--output", help="Write the plan JSON."),
    schedule: Path | None = typer.Option(
        None, "--schedule", help="Write the best candidate's schedule JSON."
    ),
    torch_csv: Path | None = typer.Option(
        None, "--torch-csv", help="Write the best schedule as PyTorch's CSV."
    ),
    plot: Path | None = typer.Option(None, "--plot", help="Step time vs memory picture."),
    tp: str | None = typer.Option(None, "--tp", help="Tensor-parallel degrees, e.g. 1,2."),
    pp: str | None = typer.Option(None, "--pp", help="Pipeline sizes, e.g. 4,8."),
    v: str | None = typer.Option(None, "--v", help="Chunks per device, e.g. 1,2."),
    placement: str | None = typer.Option(None, "--placement", help="loop, v or loop,v."),
    mbs: str | None = typer.Option(None, "--mbs", help="Microbatch sizes, e.g. 1,2."),
    recompute: bool | None = typer.Option(
        None, "--recompute/--no-recompute", help="Allow recompute (default: try both)."
    ),
    offload: bool | None = typer.Option(
        None, "--offload/--no-offload", help="Allow offload (default: try both)."
    ),
    sharding: bool | None = typer.Option(
        None,
        "--optimizer-sharding/--no-optimizer-sharding",
        help="Shard the optimizer state over dp (default: try both).",
    ),  # fmt: skip
    ac: str | None = typer.Option(
        None, "--ac", help="Activation checkpointing modes, e.g. none,full (default none)."
    ),
    cp: str | None = typer.Option(None, "--cp", help="Context-parallel degrees, e.g. 1,2."),
    dp_shard: str | None = typer.Option(
        None, "--dp-shard", help="FSDP shard degrees, e.g. 8 (default 1: plain dp)."
    ),
    fp8: bool = typer.Option(False, "--fp8", help="Allow Float8 linear layers."),
    compile: bool = typer.Option(False, "--compile", help="Allow torch.compile."),
    async_tp: bool = typer.Option(False, "--async-tp", help="Allow AsyncTP (with --compile)."),
    time_limit: float = typer.Option(300.0, "--time-limit", help="Seconds for the whole plan."),
    workers: int | None = typer.Option(
        None, "--workers", help="Local solver processes (default: CPUs, at most 4)."
    ),
    ray: str | None = typer.Option(
        None, "--ray", help="Solve on a Ray cluster: its ADDRESS, or auto."
    ),
    seed: int = typer.Option(0, "--seed", help="Solver seed."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
) -> None:
    """Rank the configurations of a training job by step time (tp, pp, dp, v, placement,
    mbs, layer split, recompute, offload, optimizer sharding), each with a solved schedule,
    beside torchtitan's and Megatron-LM's defaults.

    Ctrl-C or SIGTERM stops submitting candidates; the plan of those solved is written
    (exit 130).
    """
    from pp_opt.planner import Pins
    from pp_opt.planner import plan as run_plan

    for path in (output, schedule, torch_csv, plot):
        if path is not None:
            check_writable(path)
    pins = Pins(tp=_ints("tp", tp), pp=_ints("pp", pp), v=_ints("v", v),
                placement=_placements(placement), mbs=_ints("mbs", mbs), recompute=recompute,
                offload=offload, optimizer_sharding=sharding, ac=_modes(ac), cp=_ints("cp", cp),
                dp_shard=_ints("dp_shard", dp_shard), fp8=fp8, compile=compile,
                async_tp=async_tp)  # fmt: skip
    count = workers if workers is not None else max(1, min(4, os.cpu_count() or 1))
    result = run_plan(model=model, hardware=hardware, gpus=gpus, global_batch=global_batch,
                      seq=seq, pins=pins, time_limit=time_limit, workers=count, ray=ray,
                      seed=seed, progress=_progress(quiet))  # fmt: skip
    best = result.best_schedule()
    if best is not None and torch_csv is not None:
        from pp_opt.export import export

        export(best, "torch-csv", torch_csv)
    if result.best is not None:
        from pp_opt.planner.training import training_settings

        result.training = training_settings(
            result.best, n_layers=result.inputs.model.layers,
            global_batch=result.inputs.global_batch,
            schedule_csv=None if torch_csv is None else str(torch_csv),
        )  # fmt: skip
    result.save(output)
    if best is not None and schedule is not None:
        from pp_opt.schedule_io import save_schedule

        save_schedule(best, schedule)
    if plot is not None:
        from pp_opt.planner.plot import save_plan_figure

        save_plan_figure(result, plot)
    from pp_opt.planner.report import plan_report

    say(plan_report(result, top=5 if quiet else 10))
    for path in (output, schedule, torch_csv, plot):
        if path is not None and (path != schedule or best is not None):
            say(f"wrote {path}")
    from pp_opt.solvers.interrupt import stop_requested

    reason = stop_requested()
    if reason is not None:
        say(f"{reason}: wrote the plan of the candidates solved so far", err=True)
        raise typer.Exit(exit_codes.INTERRUPTED)
    if result.best is None:
        say("error: no configuration has a schedule that fits the memory", err=True)
        raise typer.Exit(exit_codes.INFEASIBLE)


def register(app: typer.Typer) -> None:
    app.command()(plan)
