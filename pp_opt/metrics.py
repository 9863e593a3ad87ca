"""Metrics of docs/design.md §4 and memory over time, computed from timed ops."""

from __future__ import annotations

from collections.abc import Iterable

from pp_opt.errors import ProblemError
from pp_opt.levels import running_levels
from pp_opt.ops import OpKind, Stream, memory_delta
from pp_opt.problem import Problem
from pp_opt.schedule import Metrics, ScheduledOp, dag_ops
from pp_opt.time_rule import settle_frees, time_slack


def recomputed_pairs(ops: Iterable[ScheduledOp]) -> set[tuple[int, int]]:
    """(stage, microbatch) pairs whose forward is recomputed (they have an ``R`` op)."""
    return {(op.stage, op.microbatch) for op in ops if op.kind is OpKind.R}


def memory_events(problem: Problem, ops: Iterable[ScheduledOp]) -> list[list[tuple[float, float]]]:
    """Per device, ``(time, delta)`` events in the order the time rule applies them.

    Frees come before allocations at equal times, and a free within the rule's slack
    after an allocation counts as before it (:func:`pp_opt.time_rule.settle_frees`), as
    the validator counts it.
    """
    ops = dag_ops(ops)  # a pair holds the memory of its halves
    recomputed = recomputed_pairs(ops)
    slack = time_slack(ops)
    events: list[list[tuple[float, float, None]]] = [[] for _ in range(problem.p)]
    for op in ops:
        at_start, at_end = memory_delta(
            problem,
            op.kind,
            op.stage,
            fraction=op.fraction,
            recomputed=(op.stage, op.microbatch) in recomputed,
        )
        device = problem.device_of(op.stage)
        if at_start:
            events[device].append((op.start, at_start, None))
        if at_end:
            events[device].append((op.end, at_end, None))
    settled = []
    for row in events:
        row.sort(key=lambda event: event[:2])  # ties as ever: by time, then delta
        settled.append([(time, delta) for time, delta, _ in settle_frees(row, slack)])
    return settled


def memory_profile(problem: Problem, ops: Iterable[ScheduledOp]) -> list[list[tuple[float, float]]]:
    """Per device, the step function ``(time, level)`` of static plus activation memory
    (each level summed exactly, :func:`pp_opt.levels.running_levels`)."""
    profiles = []
    for device, events in enumerate(memory_events(problem, ops)):
        static = problem.devices[device].static
        steps = [(0.0, static)]
        levels = running_levels(static, (delta for _, delta in events))
        for (time, _), level in zip(events, levels, strict=True):
            if steps[-1][0] == time:
                steps[-1] = (time, level)
            else:
                steps.append((time, level))
        profiles.append(steps)
    return profiles


def peak_memory(problem: Problem, ops: Iterable[ScheduledOp]) -> list[float]:
    return [max(level for _, level in steps) for steps in memory_profile(problem, ops)]


def compute_metrics(problem: Problem, ops: Iterable[ScheduledOp]) -> Metrics:
    ops = list(ops)
    if not ops:
        raise ProblemError("ops", "a schedule without ops has no metrics; give at least one")
    first = min(op.start for op in ops)
    makespan = max(op.end for op in ops) - first
    starts = [float("inf")] * problem.p
    ends = [float("-inf")] * problem.p
    busy = [0.0] * problem.p
    for op in ops:
        device = problem.device_of(op.stage)
        starts[device] = min(starts[device], op.start)
        ends[device] = max(ends[device], op.end)
        if op.stream is Stream.COMPUTE:
            busy[device] += op.end - op.start
    span = [e - s if e >= s else 0.0 for s, e in zip(starts, ends, strict=True)]
    longest = max(span)
    return Metrics(
        makespan=makespan,
        span=span,
        bubble_rate=(longest - max(busy)) / longest if longest > 0 else 0.0,
        idle_fraction=1.0 - sum(busy) / (problem.p * makespan) if makespan > 0 else 0.0,
        peak_memory=peak_memory(problem, ops),
        busy=busy,
    )
