"""A schedule's peak memory per pipeline rank, as named terms that add up to it.

The problem's static memory of a pipelined FSDP job counts every stage's fp32 unsharded
gradients (a bound the solver keeps). They are held only from a stage's first backward to
its last (:func:`memory_breakdown.held_gradient_bytes`), so the peak of a schedule is its
memory profile minus the gradients not yet (or no longer) held at each moment, plus the
allocator's fragmentation of the bytes that come and go (:mod:`memory_breakdown`). The
terms at that moment: the static ones, the held gradients, the in-flight activations (the
last stage's fp32 log-softmax apart, as ``loss``) and the allocator's.
"""

from __future__ import annotations

from pp_opt.metrics import memory_profile
from pp_opt.ops import OpKind
from pp_opt.profiler.analytic import static_memory_terms
from pp_opt.profiler.costs import CostProfile
from pp_opt.profiler.loss import loss_kept_bytes
from pp_opt.profiler.memory_breakdown import (
    TERMS,
    fragmentation_share,
    held_gradient_bytes,
)
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


def _in_flight(schedule: Schedule, stage: int, t: float) -> int:
    """Microbatches of ``stage`` whose forward has started by ``t`` (it allocates at its start)
    and whose backward has not ended (it frees at its end)."""
    done = sum(1 for op in schedule.ops if op.stage == stage and op.kind is OpKind.F
               and op.start <= t)  # fmt: skip
    back = sum(1 for op in schedule.ops if op.stage == stage and op.kind in BACKWARD_KINDS
               and op.end <= t)  # fmt: skip
    return max(done - back, 0)


def _peak_moment(
    steps: list[tuple[float, float]], mine: list[int], held: list[float],
    windows: dict[int, tuple[float, float]], static: float, share: float,
) -> tuple[float, float, float]:  # fmt: skip
    """``(time, activation bytes, held gradient bytes)`` at the device's reserved peak."""
    bound = sum(held[s] for s in mine)
    times = sorted({t for t, _ in steps} | {t for s in mine for t in windows.get(s, ())})
    best, index = (-1.0, 0.0, 0.0, 0.0), 0
    for t in times:
        while index + 1 < len(steps) and steps[index + 1][0] <= t:
            index += 1
        holding = sum(held[s] for s in mine if s in windows
                      and windows[s][0] <= t < windows[s][1])  # fmt: skip
        active = steps[index][1] - static
        reserved = steps[index][1] - bound + holding + share * (active + holding)
        if reserved > best[0]:
            best = (reserved, t, active, holding)
    return best[1], best[2], best[3]


def device_peaks(profile: CostProfile, schedule: Schedule) -> list[dict[str, float]]:
    """Per device, the named terms of its reserved peak (:data:`memory_breakdown.TERMS`) and
    their sums: ``allocated`` (all but ``allocator``) and ``reserved`` (all; what torchtitan
    reports)."""
    problem, job = schedule.problem, profile.job
    statics = static_memory_terms(profile.model, list(profile.stages), job, profile.hardware)
    held = [held_gradient_bytes(job, st) for st in profile.stages]
    windows = gradient_windows(schedule)
    share = fragmentation_share(profile.hardware, job)
    card, last = profile.model, len(profile.stages) - 1
    logits = loss_kept_bytes(card, job, job.mbs * job.seq / job.cp)
    out = []
    for d, steps in enumerate(memory_profile(problem, schedule.ops)):
        mine = [s for s in range(problem.num_stages) if problem.device_of(s) == d]
        static = problem.devices[d].static
        t, active, holding = _peak_moment(steps, mine, held, windows, static, share)
        terms = dict.fromkeys(TERMS, 0.0)
        for key, value in statics[d].items():
            terms[key] += value
        terms["fsdp_accumulated_grads"] = holding
        kept = _in_flight(schedule, last, t) * logits if last in mine else 0.0
        kept = min(max(kept, 0.0), max(active, 0.0))
        terms["loss"] += kept
        terms["activations"] = active - kept
        terms["allocator"] += share * (active + holding)
        terms["allocated"] = sum(v for k, v in terms.items() if k != "allocator")
        terms["reserved"] = terms["allocated"] + terms["allocator"]
        out.append(terms)
    return out
