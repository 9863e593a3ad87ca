"""Timing: every DAG edge and its latency, one op per stream, one copy per link direction."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from pp_opt.ops import STREAMS, Stream, stream_of
from pp_opt.schedule import ScheduledOp
from pp_opt.validator.context import Context
from pp_opt.validator.violation import Violation


def check_dependencies(ctx: Context) -> list[Violation]:
    """For every edge ``u -> w`` of the DAG among present ops: ``start(w) >= end(u) + latency``."""
    found = []
    for u, w, latency in ctx.dag.edges(data="latency"):
        before, after = ctx.first.get(u), ctx.first.get(w)
        if before is None or after is None:
            continue
        ready = before.end + latency
        early = ready - after.start
        if early > ctx.time_tol:
            found.append(
                Violation(
                    rule="dependency",
                    message=(
                        f"starts at {after.start:.6g}, but it needs {u} (ends {before.end:.6g}) "
                        f"+ latency {latency:.6g} = {ready:.6g}"
                    ),
                    op=w,
                    device=ctx.device_of(after),
                    amount=early,
                )
            )
    found.sort(key=lambda v: (ctx.first[v.op].start if v.op else 0.0, str(v.op)))
    return found


def check_streams(ctx: Context) -> list[Violation]:
    """One op at a time on each ``(device, stream)`` (the stream the op's kind runs on)."""
    lanes: dict[tuple[int, Stream], list[ScheduledOp]] = defaultdict(list)
    for op in ctx.placed:
        lanes[(ctx.device_of(op), stream_of(op.kind))].append(op)
    found = []
    for (device, stream), ops in sorted(lanes.items()):
        for earlier, later, late_by in _overlaps(ops):
            found.append(
                Violation(
                    rule="stream_overlap",
                    message=(
                        f"starts at {later.start:.6g} on the {stream.value} stream while "
                        f"{earlier.key} runs there until {earlier.end:.6g}"
                    ),
                    op=later.key,
                    device=device,
                    amount=late_by,
                )
            )
    return [v for v in found if v.amount > ctx.time_tol]


def check_host_links(ctx: Context) -> list[Violation]:
    """Devices sharing a host link copy one op at a time per direction (d2h, h2d)."""
    found = []
    for group in ctx.problem.host_links:
        if len(group) < 2:
            continue
        for stream in (s for s, row in STREAMS.items() if row.host_copy):
            ops = [
                op
                for op in ctx.placed
                if stream_of(op.kind) is stream and ctx.device_of(op) in group
            ]
            for earlier, later, late_by in _overlaps(ops, ctx.device_of):
                if late_by <= ctx.time_tol:
                    continue
                found.append(
                    Violation(
                        rule="link_overlap",
                        message=(
                            f"{stream.value} copy starts at {later.start:.6g} while "
                            f"{earlier.key} of device {ctx.device_of(earlier)} uses the shared "
                            f"host link {tuple(group)} until {earlier.end:.6g}"
                        ),
                        op=later.key,
                        device=ctx.device_of(later),
                        amount=late_by,
                    )
                )
    return found


def _overlaps(
    ops: Iterable[ScheduledOp], owner: Callable[[ScheduledOp], int] | None = None
) -> list[tuple[ScheduledOp, ScheduledOp, float]]:
    """Ops that start before an earlier op ends: ``(earlier, later, by how much)``.

    Ops are taken by start time; each is compared with the earlier op that ends
    last. With ``owner`` (the device, on a shared link) only ops of other owners
    count: same-device overlaps are the stream rule's business. Ops of zero
    duration occupy nothing and never conflict.
    """
    ordered = sorted(ops, key=lambda o: (o.start, o.end, o.stage, o.microbatch))
    latest: dict[int, ScheduledOp] = {}
    found = []
    for op in ordered:
        if op.end <= op.start:
            continue
        mine = owner(op) if owner is not None else 0
        rivals = [other for who, other in latest.items() if owner is None or who != mine]
        blocking = max(rivals, key=lambda o: o.end, default=None)
        if blocking is not None and blocking.end > op.start:
            found.append((blocking, op, blocking.end - op.start))
        held = latest.get(mine)
        if held is None or op.end > held.end:
            latest[mine] = op
    return found
