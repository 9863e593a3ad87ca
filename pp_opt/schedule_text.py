"""Plain-text views of a schedule: a metrics table and a Gantt chart for the terminal."""

from __future__ import annotations

from pp_opt.errors import ProblemError
from pp_opt.ops import OpKind, Stream
from pp_opt.schedule import Schedule, ScheduledOp

_GLYPHS = {
    OpKind.F: "Ff",
    OpKind.B: "Bb",
    OpKind.W: "Ww",
    OpKind.BW: "Xx",
    OpKind.R: "Rr",
    OpKind.OFFLOAD: "><",
    OpKind.RELOAD: "<>",
    OpKind.FB: "Pp",
}
LEGEND = (
    "F forward, B backward-input, W backward-weight, X fused backward, R recompute, "
    "> offload, < reload, . idle"
)


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def metrics_table(schedule: Schedule) -> str:
    """Solver outcome and metrics, one per line, then per-device span, busy time and memory."""
    problem, solver, metrics = schedule.problem, schedule.solver, schedule.metrics
    unit = "M_B" if problem.unit == "m_b" else "bytes"
    lines = [
        f"problem      {problem.name or '-'}: p={problem.p} m={problem.m} "
        f"stages={problem.num_stages} placement={problem.placement} v={problem.v} "
        f"objective={problem.objective}",
        f"made by      {solver.name} ({solver.status}) in {solver.seconds:.2f} s",
        f"objective    {_fmt(solver.objective, 6)}   lower bound {_fmt(solver.lower_bound, 6)}"
        f"   gap {'-' if solver.gap is None else f'{solver.gap:.2%}'}",
        f"makespan     {metrics.makespan:.6g}",
        f"max span     {max(metrics.span):.6g}",
        f"bubble rate  {metrics.bubble_rate:.4f}",
        f"idle         {metrics.idle_fraction:.4f}",
        "",
        f"{'device':>6} {'span':>12} {'busy':>12} {'peak memory':>14} {'cap':>14}  ({unit})",
    ]
    for d in range(problem.p):
        lines.append(
            f"{d:>6} {metrics.span[d]:>12.6g} {metrics.busy[d]:>12.6g} "
            f"{metrics.peak_memory[d]:>14.6g} {problem.devices[d].cap:>14.6g}"
        )
    return "\n".join(lines)


def _row(ops: list[ScheduledOp], t0: float, scale: float, width: int) -> str:
    cells = ["."] * width
    for op in ops:
        lo = int((op.start - t0) * scale)
        hi = max(lo + 1, int(round((op.end - t0) * scale)))
        glyph = _GLYPHS[op.kind][op.microbatch % 2]
        for c in range(max(lo, 0), min(hi, width)):
            cells[c] = glyph
    return "".join(cells)


def text_gantt(schedule: Schedule, *, width: int = 100) -> str:
    """One row per device (plus its copy streams when it has any); letters alternate case by
    microbatch so neighbouring ops stay apart."""
    if isinstance(width, bool) or not isinstance(width, int) or not 10 <= width <= 10_000:
        raise ProblemError("width", f"got {width!r}; give a number of columns from 10 to 10000")
    ops = schedule.ops
    if not ops:
        return "no ops"
    t0 = min(op.start for op in ops)
    t1 = max(op.end for op in ops)
    scale = width / (t1 - t0) if t1 > t0 else 1.0
    lines = [f"time {t0:.6g} .. {t1:.6g}, one column = {(t1 - t0) / width:.4g}"]
    for d in range(schedule.problem.p):
        own = schedule.device_ops(d)
        for stream in Stream:
            stream_ops = [op for op in own if op.stream is stream]
            if stream is Stream.COMPUTE or stream_ops:
                label = f"dev {d:<3}" if stream is Stream.COMPUTE else f"  {stream.value:<5}"
                lines.append(f"{label} |{_row(stream_ops, t0, scale, width)}|")
    lines.append(LEGEND)
    return "\n".join(lines)
