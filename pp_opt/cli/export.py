"""The ``export`` command: a schedule JSON as PyTorch CSV, a Perfetto trace, or a picture."""

from __future__ import annotations

from pathlib import Path

import typer

from pp_opt.cli.common import ForceOption, checked_for_output
from pp_opt.cli.output import say
from pp_opt.errors import ProblemError


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
    options = {"drop_offload": drop_offload} if fmt.startswith("torch-csv") else {}
    write(schedule, fmt, out, force=force, **options)
    say(f"wrote {out} ({fmt})")


def register(app: typer.Typer) -> None:
    app.command()(export)
