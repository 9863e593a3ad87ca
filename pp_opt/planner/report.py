"""The plan as text: the ranked candidates, the defaults beside the best, the counts."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from pp_opt.planner.evaluate import SOLVED, Scored
from pp_opt.planner.result import Plan

GIB = 2.0**30
HEADER = ("#", "configuration", "layers", "order", "makespan", "dp_sync", "step ms", "tok/s/GPU",
          "MFU", "peak GiB", "status")  # fmt: skip


def _row(rank: str, s: Scored) -> list[str]:
    c = s.candidate
    order = "pp_opt" if s.order == SOLVED else s.order
    name = f"{s.label}: " if s.label else ""
    if not s.ok:
        status = f"{s.status}: {s.largest_term}" if s.largest_term else s.status
        return [rank, name + c.label(), ",".join(map(str, s.candidate.layers)), order, "-", "-",
                "-", "-", "-", "-", status]  # fmt: skip
    gap = "" if s.gap is None or s.status == "optimal" else f" {s.gap:.1%}"
    return [
        rank, name + c.label(), ",".join(map(str, s.candidate.layers)), order,
        f"{s.iteration_makespan:.1f}", f"{s.dp_sync:.1f}", f"{s.step_time:.1f}",
        f"{s.tokens_per_s_per_gpu:.0f}", f"{s.mfu:.1%}", f"{max(s.peak_memory) / GIB:.1f}",
        s.status + gap,
    ]  # fmt: skip


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [r[i].rjust(w) if i == 0 or i > 3 else r[i].ljust(w) for i, w in enumerate(widths)]
        lines.append("  ".join(cells).rstrip())
    return lines


def _distinct(ranked: Sequence[Scored]) -> list[tuple[int, Scored, int]]:
    """``(rank, candidate, alike)``: each candidate that differs from those above it by more
    than its recompute, offload or sharding switches, or has another step time; ``alike``
    counts those folded into it."""
    out: list[tuple[int, Scored, int]] = []
    seen: dict[tuple[object, ...], int] = {}
    for rank, s in enumerate(ranked, start=1):
        j = s.candidate.job
        key = (j.tp, j.pp, j.v, j.placement, j.mbs, j.layers, round(s.step_time or 0, 3))
        if key in seen:
            first, best, alike = out[seen[key]]
            out[seen[key]] = (first, best, alike + 1)
        else:
            seen[key] = len(out)
            out.append((rank, s, 0))
    return out


OVER_MEMORY_SHOWN = 10
"""Infeasible candidates the report names (the rest are counted)."""


def _over_memory(failed: Sequence[Scored]) -> list[str]:
    """One line per solved candidate found over its memory: its peak rank's largest term."""
    over = [s for s in failed if s.status == "infeasible"]
    if not over:
        return []
    lines = [f"out of memory ({len(over)}; the peak rank's largest term and its peak, GiB):"]
    for s in over[:OVER_MEMORY_SHOWN]:
        lines.append(f"  {s.candidate.label()}: {s.largest_term or 'no schedule to measure'}")
    if len(over) > OVER_MEMORY_SHOWN:
        lines.append(f"  ... and {len(over) - OVER_MEMORY_SHOWN} more")
    return lines


def plan_report(plan: Plan, *, top: int = 10) -> str:
    """Top ``top`` candidates, the defaults, pruned and skipped counts, training settings."""
    i = plan.inputs
    lines = [
        f"plan: {i.model.name} on {i.gpus} x {i.hardware.name}, global batch {i.global_batch}, "
        f"seq {i.seq}: {plan.configurations} configurations, {len(plan.candidates)} candidates "
        f"ranked, {sum(plan.pruned.values())} pruned ({plan.unsolved} left unsolved by the time "
        f"limit), {plan.seconds:.1f} s"
    ]
    rows = [list(HEADER)]
    for rank, s, alike in _distinct(plan.candidates)[:top]:
        row = _row(str(rank), s)
        if alike:
            row[1] += f" (+{alike} alike)"
        rows.append(row)
    lines += _table(rows)
    if any(alike for _, _, alike in _distinct(plan.candidates)[:top]):
        lines.append(
            "(+n alike: as many more candidates, the same but for recompute, offload or "
            "optimizer sharding, have the same step time)"
        )
    if plan.baselines:
        lines.append("defaults on the same costs:")
        lines += _table([list(HEADER)] + [_row("", s) for s in plan.baselines])
    lines += _over_memory(plan.failed)
    for title, counts in (("pruned", plan.pruned), ("skipped", plan.skipped)):
        if counts:
            lines.append(
                f"{title}: " + "; ".join(f"{n} {why}" for why, n in sorted(counts.items()))
            )
    lines += training_lines(plan.training)
    return "\n".join(lines)


def training_lines(training: dict[str, Any]) -> list[str]:
    """The plan's notes and the flags its best takes: torchtitan's, Megatron-LM's and the
    environment Megatron-LM needs for them."""
    lines = [f"note: {note}" for note in training.get("notes", [])]
    if "schedule_csv_note" in training:
        lines.append(f"note: {training['schedule_csv_note']}")
    if "torchtitan" in training:
        titan = training["torchtitan"]
        lines.append(f"torchtitan {titan['version']} flags ({training.get('candidate', '')}): "
                     + shlex.join(titan["flags"]))  # fmt: skip
    if "megatron" in training:
        lines.append("Megatron-LM: " + shlex.join(training["megatron"]))
        if "megatron_env" in training:
            lines.append(f"Megatron-LM environment: {training['megatron_env']}")
    if "megatron_note" in training:
        lines.append(f"Megatron-LM: {training['megatron_note']}")
    return lines
