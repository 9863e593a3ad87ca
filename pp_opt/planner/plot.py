"""A plan as a picture: step time against peak memory, every evaluated candidate, the Pareto
front marked (matplotlib, an optional extra, imported only when something is drawn)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pp_opt.planner.evaluate import SOLVED, Scored
from pp_opt.planner.result import Plan

if TYPE_CHECKING:
    from matplotlib.axes import Axes

GIB = 2.0**30


def _time(s: Scored) -> float:
    return float("nan") if s.step_time is None else s.step_time


def _memory(s: Scored) -> float:
    return max(s.peak_memory) / GIB if s.peak_memory else float("nan")


def pareto_front(scored: Sequence[Scored]) -> list[Scored]:
    """Candidates no other beats on both step time and peak memory, by step time."""
    points = sorted((s for s in scored if s.ok), key=lambda s: (_time(s), _memory(s)))
    front: list[Scored] = []
    for s in points:
        if not front or _memory(s) < _memory(front[-1]):
            front.append(s)
    return front


def plot_plan(plan: Plan, ax: Axes | None = None, *, title: bool = True) -> Axes:
    """Draw every evaluated candidate (step time in ms against its peak memory in GiB), the
    Pareto front as a line, the best as a star and the defaults as crosses."""
    from pp_opt.export.plot import _matplotlib

    _matplotlib()
    if ax is None:
        ax = _new_axes()
    ok = [s for s in plan.candidates if s.ok]
    ax.scatter([_memory(s) for s in ok], [_time(s) for s in ok], s=14, color="#4878d0",
               alpha=0.6, label=f"{len(ok)} candidates")  # fmt: skip
    front = sorted(pareto_front(ok), key=_memory)  # the best step time within each memory
    ax.plot([_memory(s) for s in front], [_time(s) for s in front], color="#d65f5f",
            marker="o", markersize=5, drawstyle="steps-post", label="Pareto front")  # fmt: skip
    if ok:
        best = ok[0]
        ax.scatter([_memory(best)], [_time(best)], marker="*", s=160, color="#d65f5f",
                   zorder=3, label=f"best: {best.candidate.label()}")  # fmt: skip
    for s in plan.baselines:
        if s.ok:
            order = "pp_opt order" if s.order == SOLVED else s.order
            split = ",".join(map(str, s.candidate.layers))
            ax.scatter([_memory(s)], [_time(s)], marker="x", s=40,
                       label=f"{s.label} {split} ({order})")  # fmt: skip
    ax.axvline(plan.inputs.hardware.usable_bytes / GIB, color="#8c8c8c", linestyle="--",
               linewidth=1, label="memory cap")  # fmt: skip
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("step time (ms)")
    if title:
        i = plan.inputs
        ax.set_title(f"{i.model.name} on {i.gpus} x {i.hardware.name}, global batch "
                     f"{i.global_batch}, seq {i.seq}", fontsize=10)  # fmt: skip
    ax.legend(fontsize=7, loc="best")
    return ax


def _new_axes() -> Axes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 5.0), layout="constrained")
    FigureCanvasAgg(fig)
    return fig.add_subplot()


def save_plan_figure(plan: Plan, path: str | Path, *, dpi: int = 150) -> Path:
    """Write :func:`plot_plan` to ``path`` (``.png``, ``.svg`` or ``.pdf``), whole or not at
    all."""
    from pp_opt.atomic import write_with
    from pp_opt.errors import ProblemError
    from pp_opt.export.plot import FIGURE_FORMATS, _matplotlib

    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FIGURE_FORMATS:
        raise ProblemError("plot", f"cannot draw {path.name!r}; use a .png, .svg or .pdf path")
    _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 5.0), layout="constrained")
    FigureCanvasAgg(fig)
    plot_plan(plan, fig.add_subplot())

    def draw(name: str) -> None:
        fig.savefig(name, format=fmt, dpi=dpi)

    write_with(path, draw, field="plot")
    return path
