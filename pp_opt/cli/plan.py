"""``pp-opt plan``: the fastest configuration of a training job, ranked with its rivals."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from pp_opt.atomic import check_writable
from pp_opt.cli import exit_codes
from pp_opt.cli.job_options import with_job_options
from pp_opt.cli.output import say
from pp_opt.cli.stopping import run_token, stop_reason
from pp_opt.frameworks.torchtitan import DEFAULT_RELEASE

if TYPE_CHECKING:
    from pp_opt.planner import Plan
    from pp_opt.planner.search import PlanProgress
    from pp_opt.planner.training import TorchtitanChoice


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


@with_job_options("plan")
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
    recompute: bool | None = typer.Option(
        None, "--recompute/--no-recompute", help="Allow recompute (default: try both)."
    ),
    offload: bool | None = typer.Option(
        None, "--offload/--no-offload", help="Allow offload (default: try both)."
    ),
    time_limit: float = typer.Option(300.0, "--time-limit", help="Seconds for the whole plan."),
    workers: int | None = typer.Option(
        None, "--workers", help="Local solver processes (default: CPUs, at most 4)."
    ),
    ray: str | None = typer.Option(
        None, "--ray", help="Solve on a Ray cluster: its ADDRESS, or auto."
    ),
    seed: int = typer.Option(0, "--seed", help="Solver seed."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
    torchtitan: str = typer.Option(
        DEFAULT_RELEASE,
        "--torchtitan",
        help="torchtitan release the settings are for: 0.3 (0.3.x) or next (main's renamed keys).",
    ),  # fmt: skip
    torchtitan_config: Path | None = typer.Option(
        None, "--torchtitan-config", help="Write a torchtitan config function file (NAME.py)."
    ),
    torchtitan_base: str | None = typer.Option(
        None,
        "--torchtitan-base",
        help="torchtitan config function it starts from, "
        "MODULE:FUNCTION (default: the model card's own, e.g. llama3_8b).",
    ),  # fmt: skip
    activation_checkpoint: str | None = typer.Option(
        None,
        "--activation-checkpoint",
        help="torchtitan's activation checkpointing: none, full or selective (default: the "
        "best plan's --ac; selective cannot run a split backward: the CSV is then fused).",
    ),  # fmt: skip
    job_fields: dict[str, Any] | None = None,
) -> None:
    """Rank the configurations of a training job by step time (tp, pp, dp, v, placement,
    mbs, layer split, recompute, offload, optimizer sharding), each with a solved schedule,
    beside torchtitan's and Megatron-LM's defaults.

    Ctrl-C or SIGTERM stops submitting candidates; the plan of those solved is written
    (exit 130).
    """
    from pp_opt.frameworks.torchtitan import activation_checkpoint as check_ac
    from pp_opt.frameworks.torchtitan import release
    from pp_opt.planner import Pins
    from pp_opt.planner import plan as run_plan
    from pp_opt.planner.training import plan_training

    release(torchtitan)
    if activation_checkpoint is not None:
        check_ac(activation_checkpoint)
    for path in (output, schedule, torch_csv, plot, torchtitan_config):
        if path is not None:
            check_writable(path)
    base = _checked_base(model, torchtitan_config, torchtitan_base)
    pins = Pins(recompute=recompute, offload=offload, **(job_fields or {}))
    count = workers if workers is not None else max(1, min(4, os.cpu_count() or 1))
    result = run_plan(model=model, hardware=hardware, gpus=gpus, global_batch=global_batch,
                      seq=seq, pins=pins, time_limit=time_limit, workers=count, ray=ray,
                      seed=seed, progress=_progress(quiet), stop=run_token())  # fmt: skip
    choice = plan_training(result, schedule_csv=None if torch_csv is None else str(torch_csv),
                           activation_checkpoint=activation_checkpoint,
                           torchtitan=torchtitan)  # fmt: skip
    result.training = choice.settings
    written = _write_outputs(result, choice, output=output, schedule=schedule,
                             torch_csv=torch_csv, plot=plot, config=torchtitan_config,
                             base=base)  # fmt: skip
    from pp_opt.planner.report import plan_report

    say(plan_report(result, top=5 if quiet else 10))
    _say_run(result, choice.settings, base=base, config=torchtitan_config)
    for path in written:
        say(f"wrote {path}")
    reason = stop_reason()
    if reason is not None:
        say(f"{reason}: wrote the plan of the candidates solved so far", err=True)
        raise typer.Exit(exit_codes.INTERRUPTED)
    if result.best is None:
        reasons = "; ".join(f"{n} {why}" for why, n in sorted(result.pruned.items()))
        say("error: no configuration has a schedule (" + (reasons or "none was solved")
            + "): no schedule, CSV or config written", err=True)  # fmt: skip
        raise typer.Exit(exit_codes.INFEASIBLE)


def _checked_base(model: str, config: Path | None, base: str | None) -> str | None:
    """The torchtitan config function the job starts from (checked before the plan runs)."""
    from pp_opt.export.torchtitan import base_config, check_config_path, split_base
    from pp_opt.frameworks.torchtitan import BASE_CONFIGS
    from pp_opt.profiler.cards import load_model_card

    if config is None:
        if base is not None:
            split_base(base)
            return base
        return BASE_CONFIGS.get(load_model_card(model).name)
    check_config_path(config)
    return base_config(load_model_card(model).name, base)


def _write_outputs(
    result: Plan, choice: TorchtitanChoice, *, output: Path, schedule: Path | None,
    torch_csv: Path | None, plot: Path | None, config: Path | None, base: str | None,
) -> list[Path]:  # fmt: skip
    """Write what the plan has; the paths written (none of a schedule the plan lacks)."""
    written = [result.save(output)]
    best = result.best_schedule()
    if best is not None and schedule is not None:
        from pp_opt.schedule_io import save_schedule

        save_schedule(best, schedule)
        written.append(schedule)
    if choice.schedule is not None and torch_csv is not None:
        from pp_opt.export import export

        export(choice.schedule, "torch-csv", torch_csv, fused_backward=choice.fused_backward)
        written.append(torch_csv)
    if "torchtitan" in choice.settings and config is not None and base is not None:
        from pp_opt.export.torchtitan import torchtitan_config_file, write_config_file

        i = result.inputs
        title = (f"{i.model.name} on {i.gpus} x {i.hardware.name}, global batch "
                 f"{i.global_batch}, seq {i.seq}, {choice.settings['candidate']}")  # fmt: skip
        text = torchtitan_config_file(choice.settings["torchtitan"], base=base, title=title)
        written.append(write_config_file(config, text))
    if plot is not None and result.candidates:
        from pp_opt.planner.plot import save_plan_figure

        save_plan_figure(result, plot)
        written.append(plot)
    return written


def _say_run(result: Plan, settings: dict[str, Any], *, base: str | None,
             config: Path | None) -> None:  # fmt: skip
    """How to start the job in torchtitan."""
    from pp_opt.export.torchtitan import run_command

    if "torchtitan" not in settings or base is None:
        return
    say("torchtitan run: " + run_command(settings["torchtitan"], base=base,
                                         nproc=result.inputs.gpus, config_file=config))  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command()(plan)
