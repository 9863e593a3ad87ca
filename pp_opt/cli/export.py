"""The ``export`` command: a schedule JSON as PyTorch CSV, a Perfetto trace, or a picture."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import typer

from pp_opt.errors import ProblemError
from pp_opt.schedule import Schedule

FORMATS = ("torch-csv", "torch-csv-comms", "trace", "png", "svg")
"""Formats ``pp-opt export`` writes."""

_BY_SUFFIX = {".csv": "torch-csv", ".json": "trace", ".png": "png", ".svg": "svg"}
_DEFAULT_SUFFIX = {
    "torch-csv": ".csv",
    "torch-csv-comms": ".comms.csv",
    "trace": ".trace.json",
    "png": ".png",
    "svg": ".svg",
}


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
) -> None:
    """Export a schedule: PyTorch pipelining CSV, Chrome/Perfetto trace, or a Gantt picture."""
    from pp_opt.schedule_io import load_schedule

    fmt = export_format(format, output)
    out = output if output is not None else default_output(schedule_path, fmt)
    if out.resolve() == schedule_path.resolve():
        raise ProblemError("--output", f"{out} is the schedule itself; choose another file")
    schedule = load_schedule(schedule_path)
    if fmt in _CSV_FORMATS:
        _write_csv(schedule, out, _CSV_FORMATS[fmt], drop_offload=drop_offload)
    else:
        _WRITERS[fmt](schedule, out)
    typer.echo(f"wrote {out} ({fmt})")


def export_format(format: str | None, output: Path | None) -> str:
    """The format asked for, or the one the output suffix implies; a clear error otherwise."""
    if format is not None:
        fmt = format.lower()
        if fmt not in FORMATS:
            raise ProblemError("--format", f"unknown {format!r}; use one of {', '.join(FORMATS)}")
        return fmt
    if output is None:
        raise ProblemError("--format", "give --format or an -o path ending in .csv/.json/.png/.svg")
    fmt_from_suffix = _BY_SUFFIX.get(output.suffix.lower())
    if fmt_from_suffix is None:
        raise ProblemError(
            "--format",
            f"cannot tell the format from {output.name!r}; "
            f"give --format ({', '.join(FORMATS)}) or use a .csv/.json/.png/.svg path",
        )
    return fmt_from_suffix


def default_output(schedule_path: Path, fmt: str) -> Path:
    """``run.json`` -> ``run.csv``, ``run.trace.json``, ``run.png``, ..."""
    return schedule_path.with_name(schedule_path.stem + _DEFAULT_SUFFIX[fmt])


def _write_csv(schedule: Schedule, out: Path, csv_format: str, *, drop_offload: bool) -> None:
    from pp_opt.export.torch_csv import write_torch_csv

    write_torch_csv(schedule, out, format=csv_format, drop_offload=drop_offload)


def _write_trace(schedule: Schedule, out: Path) -> None:
    from pp_opt.export.trace import write_trace

    write_trace(schedule, out)


def _write_figure(schedule: Schedule, out: Path, fmt: str) -> None:
    from pp_opt.export.plot import save_figure

    save_figure(schedule, out, format=fmt)


_CSV_FORMATS = {"torch-csv": "compute_only", "torch-csv-comms": "compute_comms"}
_WRITERS: dict[str, Callable[[Schedule, Path], None]] = {
    "trace": _write_trace,
    "png": lambda s, out: _write_figure(s, out, "png"),
    "svg": lambda s, out: _write_figure(s, out, "svg"),
}


def register(app: typer.Typer) -> None:
    app.command()(export)
