"""A schedule's peak memory per device as a framework reports it.

The problem's static memory of a pipelined FSDP job counts every stage's fp32 unsharded
gradients (a bound the solver keeps). They are held only from a stage's first backward to
its last (:func:`pp_opt.profiler.job_costs.held_gradient_bytes`), so the peak of a schedule
is its memory profile minus the gradients not yet (or no longer) held at each moment; times
the card's ``memory_overhead`` (reserved per allocated byte) it is what torchtitan reports
(max reserved).
"""

from __future__ import annotations

from pp_opt.metrics import memory_profile
from pp_opt.ops import OpKind
from pp_opt.profiler.costs import CostProfile
from pp_opt.profiler.job_costs import held_gradient_bytes
from pp_opt.schedule import Schedule

BACKWARD_KINDS = (OpKind.B, OpKind.BW)


def gradient_windows(schedule: Schedule) -> dict[int, tuple[float, float]]:
    """Per stage, ``(start of its first backward, end of its last)``."""
    spans: dict[int, tuple[float, float]] = {}
    for op in schedule.ops:
        if op.kind in BACKWARD_KINDS:
            first, last = spans.get(op.stage, (op.start, op.end))
            spans[op.stage] = (min(first, op.start), max(last, op.end))
    return spans


def reported_peak_memory(profile: CostProfile, schedule: Schedule) -> list[float]:
    """Per device: the schedule's peak with gradients held only while they are, in reported
    (reserved) bytes."""
    problem = schedule.problem
    held = [held_gradient_bytes(profile.job, st) for st in profile.stages]
    windows = gradient_windows(schedule)
    out = []
    for d, steps in enumerate(memory_profile(problem, schedule.ops)):
        mine = [s for s in range(problem.num_stages) if problem.device_of(s) == d]
        bound = sum(held[s] for s in mine)
        times = sorted({t for t, _ in steps} | {t for s in mine for t in windows.get(s, ())})
        peak, index = 0.0, 0
        for t in times:
            while index + 1 < len(steps) and steps[index + 1][0] <= t:
                index += 1
            holding = sum(held[s] for s in mine if s in windows
                          and windows[s][0] <= t < windows[s][1])  # fmt: skip
            peak = max(peak, steps[index][1] - bound + holding)
        out.append(peak * profile.hardware.memory_overhead)
    return out
