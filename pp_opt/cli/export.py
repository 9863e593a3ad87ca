"""The ``export`` command: a schedule JSON as PyTorch CSV, a Perfetto trace, or a picture."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from pp_opt.cli.common import ForceOption, checked_for_output
from pp_opt.cli.output import say
from pp_opt.errors import ProblemError

if TYPE_CHECKING:
    from pp_opt.schedule import Schedule


def export(
    schedule_path: Path = typer.Argument(..., metavar="SCHEDULE", help="Schedule JSON."),
    format: str | None = typer.Option(
        None,
        "--format",
        "-f",
        help="torch-csv, torch-csv-comms, trace, png or svg; "
        "taken from the -o suffix when omitted (.csv, .json, .png, .svg).",
    ),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="File to write; SCHEDULE's name with the format's suffix."
    ),
    drop_offload: bool = typer.Option(
        False,
        "--drop-offload",
        help="torch-csv: write the compute order of an offload schedule without its copies "
        "(plain PyTorch then keeps every activation on the GPU).",
    ),
    fused_backward: bool = typer.Option(
        False,
        "--fused-backward",
        help="torch-csv: each I and its W as one B at the I's place, in the same order (for "
        "activation checkpointing that cannot run a split backward, e.g. selective).",
    ),
    force: bool = ForceOption,
) -> None:
    """Export a schedule: PyTorch pipelining CSV, Chrome/Perfetto trace, or a Gantt picture.

    The schedule is validated first: an invalid one is refused (first violation named)
    unless --force. The file is written whole or not at all."""
    from pp_opt.atomic import check_writable
    from pp_opt.export import default_output, format_for
    from pp_opt.export import export as write
    from pp_opt.schedule_io import load_schedule

    fmt = format_for(output, format)
    out = output if output is not None else default_output(schedule_path, fmt)
    if out.resolve() == schedule_path.resolve():
        raise ProblemError("output", f"{out} is the schedule itself; choose another file")
    check_writable(out)
    schedule = load_schedule(schedule_path)
    checked_for_output(schedule, force=force, action="export")
    options: dict[str, bool] = {}
    if fmt.startswith("torch-csv"):
        options["drop_offload"] = drop_offload
    if fused_backward:
        if fmt != "torch-csv":
            raise ProblemError("fused_backward", f"only torch-csv fuses the backward, not {fmt}")
        options["fused_backward"] = True
    write(schedule, fmt, out, force=force, **options)
    say(f"wrote {out} ({fmt}" + (", fused backward" if fused_backward else "") + ")")
    if fused_backward:
        _say_fused_cost(schedule)


def _say_fused_cost(schedule: Schedule) -> None:
    """What fusing the backward costs in predicted time (the fused order, re-timed)."""
    from pp_opt.export.fused import fused_backward_schedule, has_split_backward

    if not has_split_backward(schedule):
        say("the schedule's backward is already fused: the CSV is unchanged")
        return
    try:
        cost = fused_backward_schedule(schedule)
    except ProblemError as err:
        say(f"fused backward not re-timed: {err}")
        return
    share = cost.added / cost.split_makespan if cost.split_makespan else 0.0
    say(f"fused backward: predicted makespan {cost.fused_makespan:.4g} against "
        f"{cost.split_makespan:.4g} split (+{cost.added:.4g}, +{share:.1%})"
        + (f"; it breaks {cost.violations[0]}" if cost.violations else ""))  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command()(export)
