"""Time an op order: earliest starts that honour edges, latencies and one op per stream.

The order is given per ``(device, stream)``; devices that share a host link also
share its copy bandwidth, and the simulator serves their copies earliest-ready first.

Streams of one device run concurrently, so an order alone lets a reload start as soon
as its offload ends, which may defeat the offload. ``waits`` are the cross-stream
synchronisations a runtime performs (CUDA events): ``(a, b)`` means ``b`` starts no
earlier than ``a`` ends. :func:`waits_of` derives them from a timed schedule so that
re-timing it never raises its memory peak nor its objective (every start can only move
earlier, and every free that preceded an allocation still precedes it).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence

import networkx as nx

from pp_opt.dag import build_dag, required_ops
from pp_opt.errors import DeadlockError, ProblemError
from pp_opt.metrics import compute_metrics
from pp_opt.ops import OpKey, OpKind, Stream, duration, stream_of
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, ScheduledOp, SolverInfo

StreamOrder = Mapping[tuple[int, Stream], Sequence[OpKey]]


def dag_for_order(problem: Problem, order: StreamOrder) -> nx.DiGraph:
    """The DAG whose op kinds match those the order uses (fused or split backward, ...)."""
    kinds = {key.kind for keys in order.values() for key in keys}
    return build_dag(
        problem,
        split_backward=OpKind.BW not in kinds,
        offload=bool(kinds & {OpKind.OFFLOAD, OpKind.RELOAD}),
        recompute=OpKind.R in kinds,
    )


def simulate(
    problem: Problem,
    order: StreamOrder,
    *,
    fractions: Mapping[OpKey, float] | None = None,
    waits: Iterable[tuple[OpKey, OpKey]] = (),
    dag: nx.DiGraph | None = None,
    solver: SolverInfo | None = None,
) -> Schedule:
    """Earliest-start times for the given per-stream op order.

    Raises :class:`DeadlockError` naming the ops that wait on each other when the
    order can never run, and :class:`ProblemError` when it lists a wrong set of ops.
    """
    dag = dag if dag is not None else dag_for_order(problem, order)
    fractions = fractions or {}
    present = _check_order(problem, dag, order)
    preds, succs = _edges(dag, present, waits)
    queues = {k: list(v) for k, v in order.items() if v}
    position = dict.fromkeys(queues, 0)
    queue_of = {key: qk for qk, keys in queues.items() for key in keys}
    waiting = {key: len(preds[key]) for key in present}
    end: dict[OpKey, float] = {}
    stream_free = dict.fromkeys(queues, 0.0)
    link_free: dict[tuple[int, Stream], float] = {}
    timed: list[ScheduledOp] = []
    heap: list[tuple[float, int, int, tuple[int, Stream]]] = []

    def ready_time(key: OpKey, qk: tuple[int, Stream]) -> float:
        t = stream_free[qk]
        for u, latency in preds[key]:
            t = max(t, end[u] + latency)
        return t

    def push_head(qk: tuple[int, Stream]) -> None:
        if position[qk] < len(queues[qk]):
            head = queues[qk][position[qk]]
            if waiting[head] == 0:
                heapq.heappush(heap, (ready_time(head, qk), qk[0], _stream_rank(qk[1]), qk))

    for qk in queues:
        push_head(qk)
    while heap:
        ready, _, _, qk = heapq.heappop(heap)
        key = queues[qk][position[qk]]
        link = _link_key(problem, qk)
        start = max(ready, link_free.get(link, 0.0)) if link else ready
        if start > ready:
            heapq.heappush(heap, (start, qk[0], _stream_rank(qk[1]), qk))
            continue
        fraction = fractions.get(key, 1.0)
        finish = start + duration(problem, key.kind, key.stage, fraction)
        timed.append(
            ScheduledOp(key.kind, key.stage, key.microbatch, qk[1], start, finish, fraction)
        )
        end[key] = finish
        stream_free[qk] = finish
        if link:
            link_free[link] = finish
        position[qk] += 1
        push_head(qk)
        for w in succs[key]:
            waiting[w] -= 1
            wq = queue_of[w]
            if waiting[w] == 0 and queues[wq][position[wq]] == w:
                push_head(wq)
    if len(end) < len(present):
        raise DeadlockError(_deadlock_message(preds, queues, position, end))
    solver = solver or SolverInfo(name="simulate", status="heuristic", objective=0.0)
    metrics = compute_metrics(problem, timed)
    solver.objective = metrics.makespan if problem.objective == "makespan" else max(metrics.span)
    return Schedule(problem=problem, ops=tuple(timed), solver=solver, metrics=metrics)


def order_of(schedule: Schedule) -> dict[tuple[int, Stream], list[OpKey]]:
    """The per-stream op order of a timed schedule (what a runtime follows)."""
    order: dict[tuple[int, Stream], list[OpKey]] = {}
    for device in range(schedule.problem.p):
        for op in schedule.device_ops(device):
            order.setdefault((device, op.stream), []).append(op.key)
    return order


def waits_of(schedule: Schedule) -> list[tuple[OpKey, OpKey]]:
    """Cross-stream waits implied by a timed schedule, per device.

    For each op and each other stream of its device, the last op there that ended at or
    before this op's start (earlier ones follow from the stream order).
    """
    waits = []
    for device in range(schedule.problem.p):
        own = schedule.device_ops(device)
        by_stream: dict[Stream, list] = {}
        for op in own:
            by_stream.setdefault(op.stream, []).append(op)
        for op in own:
            for stream, others in by_stream.items():
                if stream is op.stream:
                    continue
                done = [o for o in others if o.end <= op.start]
                if done:
                    waits.append((max(done, key=lambda o: o.end).key, op.key))
    return waits


def retime(schedule: Schedule, *, solver: SolverInfo | None = None) -> Schedule:
    """Re-time a schedule's own op order and cross-stream waits with the simulator."""
    fractions = {op.key: op.fraction for op in schedule.ops if op.fraction != 1.0}
    return simulate(
        schedule.problem,
        order_of(schedule),
        fractions=fractions,
        waits=waits_of(schedule),
        solver=solver,
    )


def _stream_rank(stream: Stream) -> int:
    return (Stream.COMPUTE, Stream.D2H, Stream.H2D).index(stream)


def _link_key(problem: Problem, qk: tuple[int, Stream]) -> tuple[int, Stream] | None:
    if qk[1] is Stream.COMPUTE:
        return None
    group = problem.link_group(qk[0])
    return None if group is None else (group, qk[1])


def _edges(
    dag: nx.DiGraph, present: set[OpKey], waits: Iterable[tuple[OpKey, OpKey]]
) -> tuple[dict[OpKey, list[tuple[OpKey, float]]], dict[OpKey, list[OpKey]]]:
    """Predecessors (with latency) and successors among present ops, waits included."""
    preds: dict[OpKey, list[tuple[OpKey, float]]] = {key: [] for key in present}
    succs: dict[OpKey, list[OpKey]] = {key: [] for key in present}
    for u, w, latency in dag.subgraph(present).edges(data="latency"):
        preds[w].append((u, latency))
        succs[u].append(w)
    for u, w in waits:
        if u not in present or w not in present:
            raise ProblemError("waits", f"{u} -> {w} names an op that is not in the order")
        preds[w].append((u, 0.0))
        succs[u].append(w)
    return preds, succs


def _check_order(problem: Problem, dag: nx.DiGraph, order: StreamOrder) -> set[OpKey]:
    present: set[OpKey] = set()
    for (device, stream), keys in order.items():
        for key in keys:
            if key not in dag:
                raise ProblemError("order", f"{key} is not an op of this problem")
            if key in present:
                raise ProblemError("order", f"{key} is listed twice; list each op once")
            if problem.device_of(key.stage) != device or stream_of(key.kind) is not stream:
                raise ProblemError(
                    "order",
                    f"{key} is listed on device {device} {stream.value}; it runs on device "
                    f"{problem.device_of(key.stage)} {stream_of(key.kind).value}",
                )
            present.add(key)
    missing = [k for k in required_ops(dag) if k not in present]
    if missing:
        raise ProblemError("order", f"{missing[0]} is missing ({len(missing)} ops in all)")
    for key in present:
        if (
            key.kind is OpKind.OFFLOAD
            and OpKey(OpKind.RELOAD, key.stage, key.microbatch) not in present
        ):
            raise ProblemError("order", f"{key} has no matching RELOAD; add it before the backward")
        if (
            key.kind is OpKind.RELOAD
            and OpKey(OpKind.OFFLOAD, key.stage, key.microbatch) not in present
        ):
            raise ProblemError("order", f"{key} has no matching OFFLOAD")
    return present


def _deadlock_message(
    preds: Mapping[OpKey, list[tuple[OpKey, float]]],
    queues: Mapping[tuple[int, Stream], Sequence[OpKey]],
    position: Mapping[tuple[int, Stream], int],
    end: Mapping[OpKey, float],
) -> str:
    parts = []
    for (device, stream), keys in queues.items():
        if position[(device, stream)] >= len(keys):
            continue
        head = keys[position[(device, stream)]]
        blockers = [str(u) for u, _ in preds[head] if u not in end]
        parts.append(f"{head} on device {device} {stream.value} waits for {', '.join(blockers)}")
    return (
        "deadlock, these ops wait on each other: "
        + "; ".join(parts[:6])
        + (f"; and {len(parts) - 6} more" if len(parts) > 6 else "")
    )
