"""Checks of each op on its own: present exactly once, right stream, right duration, start >= 0."""

from __future__ import annotations

import math
from collections import defaultdict

from pp_opt.dag import required_ops
from pp_opt.ops import (
    BACKWARD_KINDS,
    COPY_KINDS,
    OpKey,
    OpKind,
    Stream,
    duration,
    pair_time,
    stream_of,
)
from pp_opt.schedule import ScheduledOp
from pp_opt.validator.context import Context
from pp_opt.validator.violation import Violation


def check_presence(ctx: Context) -> list[Violation]:
    """Each op of the DAG variant at most once, nothing else, and every required op."""
    violations = []
    starts: dict[OpKey, list[float]] = defaultdict(list)
    for op in (half for listed in ctx.ops for half in listed.halves()):
        key = op.key
        if key in ctx.dag:
            starts[key].append(op.start)
            continue
        known_stage = 0 <= op.stage < ctx.problem.num_stages
        violations.append(
            Violation(
                rule="unknown_op",
                message=f"{_unknown_reason(ctx, op)}; remove it or fix its kind, stage, microbatch",
                op=op.key,
                device=ctx.problem.device_of(op.stage) if known_stage else None,
                amount=1.0,
            )
        )
    for key, times in starts.items():
        if len(times) > 1:
            listed = ", ".join(f"{t:.6g}" for t in sorted(times))
            violations.append(
                Violation(
                    rule="duplicate",
                    message=f"listed {len(times)} times (starting at {listed}); list each op once",
                    op=key,
                    device=ctx.problem.device_of(key.stage),
                    amount=float(len(times) - 1),
                )
            )
    for key in required_ops(ctx.dag):
        if key not in starts:
            violations.append(
                Violation(
                    rule="missing",
                    message="required op is not in the schedule; every F, backward and W must run",
                    op=key,
                    device=ctx.problem.device_of(key.stage),
                    amount=1.0,
                )
            )
    return violations


def _unknown_reason(ctx: Context, op: ScheduledOp) -> str:
    problem = ctx.problem
    if not 0 <= op.stage < problem.num_stages:
        return f"stage {op.stage} is outside 0..{problem.num_stages - 1}"
    if not 0 <= op.microbatch < problem.m:
        return f"microbatch {op.microbatch} is outside 0..{problem.m - 1}"
    split = ctx.dag.graph["split_backward"]
    if op.kind in (OpKind.B, OpKind.W) and not split:
        return "a split-backward op in a schedule whose backward is fused BW"
    if op.kind is OpKind.BW and split:
        return "a fused BW op in a schedule whose backward is split into B and W"
    return "not an op of this problem"


def check_each_op(ctx: Context) -> list[Violation]:
    """Stream, start, duration and fraction of every op on an existing stage."""
    violations: list[Violation] = []
    stages = ctx.problem.num_stages
    streams = {kind: stream_of(kind) for kind in OpKind}
    costs: dict[tuple[OpKind, int], float] = {}
    for op in ctx.ops:
        if not 0 <= op.stage < stages:
            continue  # reported as unknown_op; it has no device, stream or cost
        if op.kind is OpKind.FB or op.partner is not None:
            violations += _pair_problems(ctx, op)
            continue
        cost = costs.get((op.kind, op.stage))
        if cost is None:
            cost = costs[op.kind, op.stage] = duration(ctx.problem, op.kind, op.stage)
        if (  # the common case, at once: every check of _op_problems passes
            op.fraction == 1.0
            and op.stream is streams[op.kind]
            and -ctx.time_tol <= op.start < math.inf
            and abs(op.end - op.start - cost) <= ctx.time_tol
        ):
            continue
        device = ctx.problem.device_of(op.stage)
        for rule, message, amount in _op_problems(ctx, op):
            violations.append(
                Violation(rule=rule, message=message, op=op.key, device=device, amount=amount)
            )
    return violations


def _op_problems(ctx: Context, op: ScheduledOp) -> list[tuple[str, str, float]]:
    found = []
    expected_stream = stream_of(op.kind)
    if op.stream is not expected_stream:
        found.append(
            (
                "stream",
                f"listed on the {op.stream.value} stream; {op.kind.value} runs on "
                f"{expected_stream.value}",
                1.0,
            )
        )
    if not math.isfinite(op.start):
        found.append(("start", f"start is {op.start}; give a finite time", math.inf))
    elif op.start < -ctx.time_tol:
        found.append(("start", f"starts at {op.start:.6g}, before time 0", -op.start))
    found += _fraction_problems(op)
    cost = duration(ctx.problem, op.kind, op.stage, op.fraction)
    if not math.isfinite(op.end):
        found.append(("duration", f"end is {op.end}; give a finite time", math.inf))
    elif math.isfinite(op.start) and abs(op.duration - cost) > ctx.time_tol:
        found.append(
            (
                "duration",
                f"runs {op.duration:.6g} (from {op.start:.6g} to {op.end:.6g}); "
                f"its cost is {cost:.6g}",
                abs(op.duration - cost),
            )
        )
    return found


def _fraction_problems(op: ScheduledOp) -> list[tuple[str, str, float]]:
    a = op.fraction
    if op.kind in COPY_KINDS:
        if not math.isfinite(a):
            return [("fraction", f"fraction is {a}; use a number in (0, 1]", math.inf)]
        if a <= 0 or a > 1:
            return [("fraction", f"fraction {a:.6g} is outside (0, 1]", a - 1 if a > 1 else -a)]
        return []
    if a != 1.0:
        return [
            (
                "fraction",
                f"fraction {a:.6g} on a {op.kind.value} op; only OFFLOAD and RELOAD move "
                "a part of an activation (leave it 1)",
                abs(a - 1.0) if math.isfinite(a) else math.inf,
            )
        ]
    return []


def _pair_problems(ctx: Context, op: ScheduledOp) -> list[Violation]:
    """An overlapped pair: an ``F`` with a ``B`` or ``BW`` of the same device, on the
    compute stream, lasting :func:`~pp_opt.ops.pair_time`."""
    problem, back, device = ctx.problem, op.partner, ctx.problem.device_of(op.stage)
    found: list[tuple[str, str, float]] = []
    if op.kind is not OpKind.FB or back is None or back.kind not in BACKWARD_KINDS:
        what = "no backward half" if back is None else f"{op.kind.value} with {back}"
        found.append(("pair", f"{what}; a pair is an FB of an F and a B or BW", 1.0))
    elif not 0 <= back.stage < problem.num_stages:
        found.append(("pair", f"its backward half's stage {back.stage} does not exist", 1.0))
    elif problem.device_of(back.stage) != device:
        found.append(("pair", f"its backward half {back} runs on device "
                      f"{problem.device_of(back.stage)}, not {device}; pair ops of one device",
                      1.0))  # fmt: skip
    if op.stream is not Stream.COMPUTE:
        found.append(("stream", f"listed on the {op.stream.value} stream; FB runs on compute", 1.0))
    if not math.isfinite(op.start):
        found.append(("start", f"start is {op.start}; give a finite time", math.inf))
    elif op.start < -ctx.time_tol:
        found.append(("start", f"starts at {op.start:.6g}, before time 0", -op.start))
    found += _fraction_problems(op)
    if not found and math.isfinite(op.end) and back is not None:
        cost = pair_time(problem, op.stage, back.stage, back.kind)
        if abs(op.duration - cost) > ctx.time_tol:
            found.append(("duration", f"runs {op.duration:.6g} (from {op.start:.6g} to "
                          f"{op.end:.6g}); the pair's time is {cost:.6g}",
                          abs(op.duration - cost)))  # fmt: skip
    elif not math.isfinite(op.end):
        found.append(("duration", f"end is {op.end}; give a finite time", math.inf))
    return [Violation(rule=rule, message=message, op=op.key, device=device, amount=amount)
            for rule, message, amount in found]  # fmt: skip
