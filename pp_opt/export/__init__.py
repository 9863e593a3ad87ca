"""Exporters: a schedule as PyTorch pipelining CSV, a Chrome/Perfetto trace, or a picture.

:func:`export` writes any of :data:`FORMATS`; the writers behind it are plain functions
too (:func:`write_torch_csv`, :func:`write_trace`, :func:`save_figure`, and
:func:`plot_schedule` / :func:`plot_memory` that draw on a matplotlib ``Axes``). The
trace and the CSV need nothing beyond the standard library; pictures need matplotlib
(``pip install 'pp-opt[plot]'``), imported only when drawing.
:mod:`pp_opt.export.training_config` writes a configuration as torchtitan config keys
and Megatron-LM flags.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pp_opt.errors import ProblemError
from pp_opt.export.plot import plot_memory, plot_schedule, save_figure
from pp_opt.export.torch_csv import torch_csv_rows, write_torch_csv
from pp_opt.export.trace import trace_events, write_trace
from pp_opt.schedule import Schedule

__all__ = [
    "FORMATS",
    "default_output",
    "export",
    "format_for",
    "plot_memory",
    "plot_schedule",
    "save_figure",
    "torch_csv_rows",
    "trace_events",
    "write_torch_csv",
    "write_trace",
]

FORMATS = ("torch-csv", "torch-csv-comms", "trace", "png", "svg")
"""What :func:`export` writes."""

_BY_SUFFIX = {".csv": "torch-csv", ".json": "trace", ".png": "png", ".svg": "svg"}
_DEFAULT_SUFFIX = {
    "torch-csv": ".csv",
    "torch-csv-comms": ".comms.csv",
    "trace": ".trace.json",
    "png": ".png",
    "svg": ".svg",
}
_OPTIONS = {
    "torch-csv": ("drop_offload", "fused_backward"),
    "torch-csv-comms": ("drop_offload",),
    "trace": ("time_unit_us",),
    "png": ("dpi",),
    "svg": ("dpi",),
}
"""Keyword options each format takes."""


def export(
    schedule: Schedule, format: str, path: str | Path, *, force: bool = False, **options: Any
) -> Path:
    """Write ``schedule`` to ``path`` in ``format``.

    Parameters
    ----------
    schedule
        The schedule to write.
    format
        One of :data:`FORMATS`: ``torch-csv`` (compute actions only, PyTorch adds the
        communication), ``torch-csv-comms`` (with explicit sends, receives and
        ``REDUCE_GRAD``), ``trace`` (Chrome/Perfetto JSON), ``png`` or ``svg`` (Gantt
        chart with memory over time). :func:`format_for` infers it from a path.
    path
        File to write.
    force
        Write an invalid schedule anyway (with a logged warning). Without it, an invalid
        schedule raises :class:`~pp_opt.validator.ValidationError` naming its first
        violation, and nothing is written.
    **options
        ``drop_offload`` (CSV: write the compute order of an offload schedule, without
        its copies), ``fused_backward`` (torch-csv: each ``I`` and its ``W`` as one ``B`` at
        the ``I``'s place), ``time_unit_us`` (trace: microseconds per problem time unit),
        ``dpi`` (pictures).

    Returns
    -------
    Path
        ``path``. The file is written whole or not at all (:mod:`pp_opt.atomic`).
    """
    from pp_opt.schedule_io import require_schedule

    require_schedule("schedule", schedule)
    if not isinstance(format, str):
        raise ProblemError("format", f"got {format!r}; use one of {', '.join(FORMATS)}")
    if not isinstance(path, str | Path):
        raise ProblemError("path", f"got {type(path).__name__}; give a file path")
    if not isinstance(force, bool):
        raise ProblemError("force", f"got {force!r}; expected True or False")
    fmt = format_for(None, format)
    allowed = _OPTIONS[fmt]
    for name in options:
        if name not in allowed:
            raise ProblemError(name, f"not an option of {fmt}; it takes {', '.join(allowed)}")
    _WRITERS[fmt](schedule, Path(path), {**options, "force": force})
    return Path(path)


def format_for(path: str | Path | None, format: str | None = None) -> str:
    """The format asked for, or the one the path's suffix implies; a clear error otherwise."""
    if format is not None:
        fmt = format.lower()
        if fmt not in FORMATS:
            raise ProblemError("format", f"unknown {format!r}; use one of {', '.join(FORMATS)}")
        return fmt
    if path is None:
        raise ProblemError(
            "format", "give a format or an output path ending in .csv/.json/.png/.svg"
        )
    from_suffix = _BY_SUFFIX.get(Path(path).suffix.lower())
    if from_suffix is None:
        raise ProblemError(
            "format",
            f"cannot tell the format from {Path(path).name!r}; "
            f"give a format ({', '.join(FORMATS)}) or use a .csv/.json/.png/.svg path",
        )
    return from_suffix


def default_output(schedule_path: str | Path, fmt: str) -> Path:
    """``run.json`` -> ``run.csv``, ``run.trace.json``, ``run.png``, ..."""
    path = Path(schedule_path)
    return path.with_name(path.stem + _DEFAULT_SUFFIX[fmt])


def _csv(csv_format: str) -> Callable[[Schedule, Path, dict[str, Any]], None]:
    def write(schedule: Schedule, path: Path, options: dict[str, Any]) -> None:
        write_torch_csv(schedule, path, format=csv_format, **options)

    return write


def _figure(fmt: str) -> Callable[[Schedule, Path, dict[str, Any]], None]:
    def write(schedule: Schedule, path: Path, options: dict[str, Any]) -> None:
        save_figure(schedule, path, format=fmt, **options)

    return write


def _trace(schedule: Schedule, path: Path, options: dict[str, Any]) -> None:
    write_trace(schedule, path, **options)


_WRITERS: dict[str, Callable[[Schedule, Path, dict[str, Any]], None]] = {
    "torch-csv": _csv("compute_only"),
    "torch-csv-comms": _csv("compute_comms"),
    "trace": _trace,
    "png": _figure("png"),
    "svg": _figure("svg"),
}
