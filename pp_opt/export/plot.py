"""Pictures of a schedule: a Gantt chart of its ops and each device's memory over time.

Plain functions over a :class:`~pp_opt.schedule.Schedule` that draw on an
optional matplotlib ``Axes`` (as PyJobShop's plotting does), so a user can put
them into figures of their own. matplotlib is an optional extra, imported only
when something is drawn. Figures made here sit on the Agg canvas directly and
never touch pyplot, so drawing works headless and leaves pyplot's state alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pp_opt.errors import PPOptError, ProblemError
from pp_opt.export.trace import time_unit
from pp_opt.metrics import memory_profile
from pp_opt.ops import STREAM_ORDER, OpKind, Stream
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, ScheduledOp

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

KIND_COLORS = {
    OpKind.F: "#4878d0",
    OpKind.B: "#ee854a",
    OpKind.W: "#6acc64",
    OpKind.BW: "#956cb4",
    OpKind.R: "#8c8c8c",
    OpKind.OFFLOAD: "#d65f5f",
    OpKind.RELOAD: "#17a2b8",
    OpKind.FB: "#d5a62a",
}
"""Fill colour of each op kind; later chunks of a device are drawn lighter."""

FIGURE_FORMATS = ("png", "svg", "pdf")
GIB = 2.0**30

_ROW_HEIGHT = {Stream.COMPUTE: 1.0, Stream.D2H: 0.55, Stream.H2D: 0.55}
_BOX_FILL = 0.86  # part of its row a box fills
_DEVICE_GAP = 0.35
_DIGIT_EM = 0.64  # width of a digit in DejaVu Sans, in font sizes


def plot_schedule(
    schedule: Schedule,
    ax: Axes | None = None,
    *,
    labels: bool = True,
    legend: bool = True,
    title: bool = True,
) -> Axes:
    """Draw a Gantt chart: one row per device and stream, ops coloured by kind.

    Each device has its compute row, with its ``d2h`` and ``h2d`` copy rows
    under it when the schedule offloads. Boxes carry their microbatch number
    where it fits; on devices with several chunks, later chunks are lighter.

    Parameters
    ----------
    schedule
        The timed schedule to draw.
    ax
        Axes to draw on; a new figure (Agg canvas) is made when omitted.
    labels, legend, title
        Microbatch numbers in boxes, a legend of op kinds, a title line.

    Returns
    -------
    Axes
        The axes drawn on (``ax.figure.savefig(...)`` writes it out).
    """
    if ax is None:
        ax = _new_figure(schedule, memory=False).axes[0]
    rows = _row_layout(schedule)
    start, end = _time_range(schedule)
    ax.set_xlim(start, end)
    ax.set_ylim(max(y + h / 2 for y, h in rows.values()) + 0.1, -0.1)
    px_per_time, px_per_row = _pixel_scale(ax, end - start)
    for (device, stream), (y, height) in rows.items():
        ops = schedule.stream_order(device, stream)
        _draw_row(ax, schedule, ops, y, height * _BOX_FILL)
        if labels and ops:
            _label_row(ax, ops, y, px_per_time, px_per_row * height * _BOX_FILL)
    _style_gantt(ax, schedule, rows)
    if legend:
        _kind_legend(ax, schedule)
    if title:
        ax.set_title(title_line(schedule), fontsize=10)
    return ax


def plot_memory(
    schedule: Schedule,
    ax: Axes | None = None,
    *,
    devices: Sequence[int] | None = None,
    legend: bool = True,
) -> Axes:
    """Draw each device's memory (static plus activations) over time, with its cap dashed.

    The levels come from :func:`pp_opt.metrics.memory_profile`, the same step
    function the metrics use, so the peak drawn is ``metrics.peak_memory``.
    Memory in bytes is shown in GiB; hand-written problems show multiples of ``m_b``.

    Parameters
    ----------
    schedule
        The timed schedule to draw.
    ax
        Axes to draw on; a new figure (Agg canvas) is made when omitted.
    devices
        Devices to draw (all by default).
    legend
        Add a legend naming the devices and the cap.

    Returns
    -------
    Axes
        The axes drawn on.
    """
    if ax is None:
        ax = _new_figure(schedule, gantt=False).axes[0]
    problem = schedule.problem
    chosen = list(range(problem.p)) if devices is None else list(devices)
    for d in chosen:
        if not 0 <= d < problem.p:
            raise ProblemError("devices", f"device {d} is outside 0..{problem.p - 1}")
    scale, unit = (GIB, "GiB") if problem.unit == "bytes" else (1.0, "× m_b")
    start, end = _time_range(schedule)
    colors = _device_colors(problem.p)
    profiles = memory_profile(problem, schedule.ops)
    top = 0.0
    for d in chosen:
        times = [t for t, _ in profiles[d]] + [end]
        levels = [level / scale for _, level in profiles[d]]
        levels.append(levels[-1])
        ax.step(times, levels, where="post", color=colors[d], lw=1.2, label=f"device {d}")
        top = max(top, *levels)
    top = max(top, _draw_caps(ax, problem, chosen, colors, scale))
    ax.set_xlim(start, end)
    ax.set_ylim(0, top * 1.08 if top > 0 else 1.0)
    ax.set_xlabel(_time_label(schedule))
    ax.set_ylabel(f"memory ({unit})")
    ax.grid(axis="both", color="#e5e5e5", lw=0.6)
    ax.set_axisbelow(True)
    if legend:
        ncol = max(1, math.ceil((len(chosen) + 1) / 12))
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, ncol=ncol,
                  frameon=False, borderaxespad=0.0)  # fmt: skip
    return ax


def save_figure(
    schedule: Schedule,
    path: str | Path,
    *,
    format: str | None = None,
    dpi: int = 150,
    force: bool = False,
) -> None:
    """Write the Gantt chart with the memory plot under it to ``path``.

    The file format comes from ``format`` or else the path's suffix
    (``.png``, ``.svg`` or ``.pdf``). The schedule is validated first (``force`` draws
    an invalid one anyway, with a warning); the file is written whole or not at all.
    """
    from pp_opt.atomic import write_with
    from pp_opt.validator import require_valid

    if isinstance(dpi, bool) or not isinstance(dpi, int | float) or not 10 <= dpi <= 2400:
        raise ProblemError("dpi", f"got {dpi!r}; give dots per inch between 10 and 2400")
    path = Path(path)
    fmt = (format or path.suffix.lstrip(".")).lower()
    if fmt not in FIGURE_FORMATS:
        raise ProblemError(
            "format", f"cannot draw {fmt or path.name!r}; use a .png, .svg or .pdf path"
        )
    require_valid(schedule, force=force, action="export")
    fig = _new_figure(schedule)
    gantt, memory = fig.axes
    plot_schedule(schedule, gantt, title=False)
    plot_memory(schedule, memory)
    gantt.set_xlabel("")
    fig.suptitle(title_line(schedule), fontsize=11)
    from matplotlib import rc_context

    def draw(name: str) -> None:
        with rc_context({"svg.fonttype": "none"}):  # SVG text stays text: smaller, searchable
            fig.savefig(name, format=fmt, dpi=dpi)

    write_with(path, draw, field="path")


def title_line(schedule: Schedule) -> str:
    """Name, solver, shape, makespan and bubble rate of a schedule, in one line."""
    problem, metrics, solver = schedule.problem, schedule.metrics, schedule.solver
    name = problem.name or "schedule"
    shape = f"p={problem.p} m={problem.m} v={problem.v} {problem.placement}"
    return (
        f"{name} · {solver.name} ({solver.status}) · {shape} · "
        f"makespan {metrics.makespan:.6g} · bubble rate {metrics.bubble_rate:.4f}"
    )


def _matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError as err:
        raise PPOptError(
            "drawing needs matplotlib, which is not installed; pip install 'pp-opt[plot]'"
        ) from err
    return matplotlib


def _new_figure(schedule: Schedule, *, gantt: bool = True, memory: bool = True) -> Figure:
    """A constrained-layout figure on the Agg canvas, sized so p = 8, m = 24 stays legible."""
    _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = _row_layout(schedule)
    gantt_height = 0.3 * max(y + h / 2 for y, h in rows.values()) + 0.9
    memory_height = 2.4
    width = min(28.0, max(10.0, 5.0 + 0.16 * _compute_slots(schedule)))
    heights = ([gantt_height] if gantt else []) + ([memory_height] if memory else [])
    fig = Figure(figsize=(width, sum(heights) + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(len(heights), 1, height_ratios=heights)
    first = fig.add_subplot(grid[0])
    if len(heights) == 2:
        fig.add_subplot(grid[1], sharex=first)
    return fig


def _compute_slots(schedule: Schedule) -> float:
    """How many typical compute ops fit end to end into the schedule's time range."""
    durations = sorted(op.duration for op in schedule.ops if op.stream is Stream.COMPUTE)
    start, end = _time_range(schedule)
    typical = durations[len(durations) // 2] if durations else 0.0
    return (end - start) / typical if typical > 0 else 0.0


def _row_layout(schedule: Schedule) -> dict[tuple[int, Stream], tuple[float, float]]:
    """Centre and height of each (device, stream) row; copy rows only if the schedule copies."""
    copies = any(op.stream is not Stream.COMPUTE for op in schedule.ops)
    streams = STREAM_ORDER if copies else (Stream.COMPUTE,)
    rows: dict[tuple[int, Stream], tuple[float, float]] = {}
    y = 0.0
    for device in range(schedule.problem.p):
        for stream in streams:
            height = _ROW_HEIGHT[stream]
            rows[(device, stream)] = (y + height / 2, height)
            y += height
        y += _DEVICE_GAP if copies else 0.0
    return rows


def _time_range(schedule: Schedule) -> tuple[float, float]:
    start = min(op.start for op in schedule.ops)
    end = max(op.end for op in schedule.ops)
    return start, end if end > start else start + 1.0


def _time_label(schedule: Schedule) -> str:
    unit = time_unit(schedule.problem)
    return f"time ({unit})" if unit else "time"


def _pixel_scale(ax: Axes, duration: float) -> tuple[float, float]:
    """Pixels per time unit and per row unit, from the axes' current size."""
    box = ax.get_window_extent()
    low, high = ax.get_ylim()
    return box.width / duration, box.height / abs(high - low)


def _chunk_index(schedule: Schedule, stage: int) -> int:
    return schedule.problem.stages_on(schedule.problem.device_of(stage)).index(stage)


def _op_color(schedule: Schedule, op: ScheduledOp) -> Any:
    """The kind's colour, mixed with white for later chunks of the device."""
    from matplotlib.colors import to_rgb

    rgb = to_rgb(KIND_COLORS[op.kind])
    v = schedule.problem.v
    if v == 1:
        return rgb
    mix = 0.45 * _chunk_index(schedule, op.stage) / (v - 1)
    return tuple(c + (1.0 - c) * mix for c in rgb)


def _draw_row(
    ax: Axes, schedule: Schedule, ops: list[ScheduledOp], y: float, height: float
) -> None:
    if not ops:
        return
    ax.broken_barh(
        [(op.start, op.duration) for op in ops],
        (y - height / 2, height),
        facecolors=[_op_color(schedule, op) for op in ops],
        edgecolors="white",
        linewidths=0.4,
    )


def _label_row(
    ax: Axes, ops: list[ScheduledOp], y: float, px_per_time: float, box_px: float
) -> None:
    """Microbatch numbers in the boxes, one font size per row, where they fit.

    The size is what fits the row's height and its typical box; boxes too
    narrow for their number at that size stay blank.
    """
    dpi = ax.figure.dpi
    digits = max(len(_op_text(op)) for op in ops)
    typical_px = sorted(op.duration for op in ops)[len(ops) // 2] * px_per_time
    fit_width = (typical_px * 0.88 - 2.0) / (digits * _DIGIT_EM) * 72.0 / dpi
    size = min(8.0, 0.62 * box_px * 72.0 / dpi, fit_width)
    if size < 5.0:
        size = min(8.0, 0.62 * box_px * 72.0 / dpi)  # label only the wider boxes
    if size < 4.5:
        return
    digit_px = _DIGIT_EM * size * dpi / 72.0
    for op in ops:
        text = _op_text(op)
        if op.duration * px_per_time * 0.9 < len(text) * digit_px + 2.0:
            continue
        label = ax.text(op.start + op.duration / 2, y, text, ha="center", va="center",
                        fontsize=size, color="black", clip_on=True)  # fmt: skip
        label.set_in_layout(False)  # inside the axes: constrained layout need not measure it


def _op_text(op: ScheduledOp) -> str:
    """The microbatch in an op's box; a pair's two, forward first (``3/1``)."""
    if op.partner is not None:
        return f"{op.microbatch}/{op.partner.microbatch}"
    return str(op.microbatch)


def _style_gantt(
    ax: Axes, schedule: Schedule, rows: dict[tuple[int, Stream], tuple[float, float]]
) -> None:
    ticks, names = [], []
    for (device, stream), (y, _) in rows.items():
        ticks.append(y)
        names.append(f"device {device}" if stream is Stream.COMPUTE else stream.value)
    ax.set_yticks(ticks, names)
    for label, (_, stream) in zip(ax.get_yticklabels(), rows, strict=True):
        if stream is not Stream.COMPUTE:
            label.set_fontsize(7)
            label.set_color("#555555")
    ax.tick_params(axis="y", length=0)
    ax.set_xlabel(_time_label(schedule))
    ax.grid(axis="x", color="#e5e5e5", lw=0.6)
    ax.set_axisbelow(True)
    copies = len(rows) > schedule.problem.p
    if copies:
        for device in range(1, schedule.problem.p):
            y, height = rows[(device, Stream.COMPUTE)]
            ax.axhline(y - height / 2 - _DEVICE_GAP / 2, color="#bbbbbb", lw=0.6)


def _kind_legend(ax: Axes, schedule: Schedule) -> None:
    from matplotlib.patches import Patch

    present = {op.kind for op in schedule.ops}
    handles = [Patch(color=KIND_COLORS[k], label=k.value) for k in OpKind if k in present]
    if schedule.problem.v > 1:
        handles.append(Patch(color="#dddddd", label="later chunk:\nlighter"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8,
              frameon=False, borderaxespad=0.0)  # fmt: skip


def _device_colors(p: int) -> list[Any]:
    from matplotlib import colormaps

    if p <= 10:
        return [colormaps["tab10"](d) for d in range(p)]
    return [colormaps["viridis"](d / (p - 1)) for d in range(p)]


def _draw_caps(
    ax: Axes, problem: Problem, chosen: list[int], colors: list[Any], scale: float
) -> float:
    """Dashed cap lines: one black line when the caps agree, else one per device."""
    caps = [problem.devices[d].cap / scale for d in chosen]
    if not caps:
        return 0.0
    if len(set(caps)) == 1:
        ax.axhline(caps[0], color="black", ls="--", lw=1.0, label="cap")
    else:
        for d, cap in zip(chosen, caps, strict=True):
            ax.axhline(cap, color=colors[d], ls="--", lw=1.0, label=f"cap {d}")
    return max(caps)
