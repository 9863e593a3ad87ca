"""Commands on problems and schedules: ``baseline``, ``validate``, ``show``."""

from __future__ import annotations

from pathlib import Path

import typer

from pp_opt.atomic import check_writable
from pp_opt.cli.common import (
    CapOption,
    ChunksAlias,
    ForceOption,
    ObjectiveOption,
    PlacementOption,
    VOption,
    checked_for_output,
    chunks_per_device,
)
from pp_opt.cli.output import say
from pp_opt.problem_overrides import problem_with_overrides


def baseline(
    name: str = typer.Argument(
        ...,
        help="gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, zb-v, v-half, v-min, pipeoffload; "
        "or PyTorch's GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, "
        "ZBVZeroBubble, DualPipeV; or with overlapped F/B pairs: dualpipev-overlap, dualpipe, "
        "interleaved-1f1b-a2a",
    ),
    problem_path: Path = typer.Argument(..., metavar="PROBLEM", help="Problem TOML or JSON."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write schedule JSON."),
    cap: float | None = CapOption,
    placement: str | None = PlacementOption,
    v: int | None = VOption,
    chunks: int | None = ChunksAlias,
    objective: str | None = ObjectiveOption,
    offload: bool | None = typer.Option(
        None, "--offload/--no-offload", help="Allow activation offload (pipeoffload)."
    ),
    time_limit: float | None = typer.Option(
        None, "--time-limit", help="Seconds v-half, v-min and pipeoffload search their settings."
    ),
) -> None:
    """Time a classic or rule schedule on a problem, validate it, and show or save it."""
    from pp_opt.orders import baseline as run_baseline
    from pp_opt.schedule_text import metrics_table

    if output is not None:
        check_writable(output)
    problem = problem_with_overrides(
        problem_path, cap=cap, placement=placement, v=chunks_per_device(v, chunks=chunks),
        objective=objective, offload=offload,
    )  # fmt: skip
    schedule = run_baseline(name, problem, time_limit=time_limit)  # validated
    if output is not None:
        from pp_opt.schedule_io import save_schedule

        save_schedule(schedule, output)
    say(metrics_table(schedule))
    if output is not None:
        say(f"wrote {output}")


def validate(
    schedule_path: Path = typer.Argument(..., metavar="SCHEDULE", help="Schedule JSON."),
) -> None:
    """Re-check a schedule file: ops, dependencies, streams, memory caps, metrics."""
    from pp_opt.schedule_io import load_schedule
    from pp_opt.validator import validate as check

    schedule = load_schedule(schedule_path)
    violations = check(schedule)
    if violations:
        say(f"{schedule_path}: INVALID, {len(violations)} violation(s):")
        for violation in violations:
            say(f"  - {violation}")
        raise typer.Exit(1)
    say(
        f"{schedule_path}: valid ({len(schedule.ops)} ops, makespan "
        f"{schedule.metrics.makespan:.6g}, peak memory {max(schedule.metrics.peak_memory):.6g})"
    )


def show(
    schedule_path: Path = typer.Argument(..., metavar="SCHEDULE", help="Schedule JSON."),
    width: int = typer.Option(100, "--width", help="Columns of the Gantt chart (10 to 10000)."),
    force: bool = ForceOption,
) -> None:
    """Print a schedule's metrics and a Gantt chart drawn in the terminal (valid ones only,
    unless --force)."""
    from pp_opt.schedule_io import load_schedule
    from pp_opt.schedule_text import metrics_table, text_gantt

    schedule = load_schedule(schedule_path)
    gantt = text_gantt(schedule, width=width)  # checks --width first
    checked_for_output(schedule, force=force, action="show")
    say(metrics_table(schedule))
    say("")
    say(gantt)


def register(app: typer.Typer) -> None:
    app.command()(baseline)
    app.command()(validate)
    app.command()(show)
