"""Time an op order: earliest starts that honour edges, latencies and one op per stream.

The order is given per ``(device, stream)``; devices that share a host link also
share its copy bandwidth, and the simulator serves their copies earliest-ready first.

Streams of one device run concurrently, so an order alone lets a reload start as soon
as its offload ends, which may defeat the offload. ``waits`` are the cross-stream
synchronisations a runtime performs (CUDA events): ``(a, b)`` means ``b`` starts no
earlier than ``a`` ends. :func:`order_of` derives them from a timed schedule so that
re-timing it never raises its memory peak nor its objective (every start can only move
earlier, and every free that preceded an allocation still precedes it).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

import networkx as nx

from pp_opt.arguments import a_schedule, a_solver_info, of_type, optional
from pp_opt.dag import dag_for, required_ops, stage_latency, successors
from pp_opt.errors import DeadlockError, ProblemError
from pp_opt.metrics import compute_metrics
from pp_opt.ops import (
    BACKWARD_KINDS,
    KINDS,
    STREAM_ORDER,
    OpKey,
    OpKind,
    Stream,
    duration,
    pair_time,
    resource_of,
    stream_of,
)
from pp_opt.order import Order, Streams
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, ScheduledOp, SolverInfo, Status, execution_order_key
from pp_opt.time_rule import counts_before, time_slack

QueueKey = tuple[int, Stream]


def simulate(
    order: Order,
    *,
    dag: nx.DiGraph | None = None,
    solver: SolverInfo | None = None,
) -> Schedule:
    """Earliest-start times for the given per-stream op order.

    Parameters
    ----------
    order
        The op order, its problem, offload fractions, cross-stream waits and variant.
    dag
        The DAG whose edges to honour; ``dag_for(order.problem, order.variant)`` when
        None. Any DAG of the same placement, microbatches and variant will do (its edge
        latencies are taken from ``order.problem``), e.g. that of a problem whose times
        were rounded.
    solver
        How the schedule was made; a ``simulate``/``heuristic`` record when None.

    Returns
    -------
    Schedule
        The timed schedule, of ``order.problem`` and ``order.variant``.

    Raises
    ------
    DeadlockError
        Naming the ops that wait on each other when the order can never run.
    ProblemError
        When the order lists a wrong set of ops.
    """
    of_type("order", order, Order, "a pp_opt Order (pp_opt.order_of)")
    optional("dag", dag, nx.DiGraph, "a DAG of pp_opt.dag.dag_for")
    a_solver_info(solver)
    problem = order.problem
    dag = dag if dag is not None else dag_for(problem, order.variant)
    present = _check_order(problem, dag, order.streams, order.pairs)
    preds, succs = _edges(problem, dag, present, order.waits, order.pairs)
    queues = {k: list(v) for k, v in order.streams.items() if v}
    timed, end, position = _run_queues(
        problem, queues, (preds, succs), order.fractions, order.pairs
    )
    if len(end) < len(preds):
        raise DeadlockError(_deadlock_message(preds, queues, position, end))
    solver = solver or SolverInfo(name="simulate", status=Status.HEURISTIC, objective=0.0)
    metrics = compute_metrics(problem, timed)
    solver.objective = metrics.makespan if problem.objective == "makespan" else max(metrics.span)
    return Schedule(
        problem=problem, ops=tuple(timed), solver=solver, metrics=metrics, variant=order.variant
    )


def _run_queues(
    problem: Problem,
    queues: dict[QueueKey, list[OpKey]],
    edges: tuple[dict[OpKey, list[tuple[OpKey, float]]], dict[OpKey, list[OpKey]]],
    fractions: Mapping[OpKey, float],
    pairs: Mapping[OpKey, OpKey],
) -> tuple[list[ScheduledOp], dict[OpKey, float], dict[QueueKey, int]]:
    """Run each stream's queue in order, every op at its earliest start (a heap of the
    streams whose head op is ready); the ops timed, their ends (a pair's under its ``F``
    key) and how far each queue got."""
    preds, succs = edges
    position = dict.fromkeys(queues, 0)
    queue_of = {key: qk for qk, keys in queues.items() for key in keys}
    waiting = {key: len(after) for key, after in preds.items()}
    end: dict[OpKey, float] = {}
    stream_free = dict.fromkeys(queues, 0.0)
    link_free: dict[QueueKey, float] = {}
    links = {qk: _link_key(problem, qk) for qk in queues}
    timed: list[ScheduledOp] = []
    heap: list[tuple[float, int, int, QueueKey]] = []

    cost = _durations(problem)

    def ready_time(key: OpKey, qk: QueueKey) -> float:
        t = stream_free[qk]
        for u, lag in preds[key]:
            if end[u] + lag > t:
                t = end[u] + lag
        return t

    def push_head(qk: QueueKey) -> None:
        if position[qk] < len(queues[qk]):
            head = queues[qk][position[qk]]
            if waiting[head] == 0:
                heapq.heappush(heap, (ready_time(head, qk), qk[0], _stream_rank(qk[1]), qk))

    for qk in queues:
        push_head(qk)
    while heap:
        ready, _, _, qk = heapq.heappop(heap)
        key = queues[qk][position[qk]]
        link = links[qk]
        start = max(ready, link_free.get(link, 0.0)) if link else ready
        if start > ready:
            heapq.heappush(heap, (start, qk[0], _stream_rank(qk[1]), qk))
            continue
        if pairs and key in pairs:
            back = pairs[key]
            finish = start + pair_time(problem, key.stage, back.stage, back.kind)
            timed.append(ScheduledOp(OpKind.FB, key.stage, key.microbatch, qk[1], start, finish,
                                     partner=back))  # fmt: skip
        else:
            if fractions and key in fractions:
                fraction = fractions[key]
                finish = start + duration(problem, key.kind, key.stage, fraction)
            else:
                fraction, finish = 1.0, start + cost[key.kind, key.stage]
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
    return timed, end, position


def order_of(schedule: Schedule) -> Order:
    """The order a timed schedule follows: per-stream ops, fractions and cross-stream waits.

    ``simulate(order_of(schedule))`` re-times it (see :func:`retime`).
    """
    a_schedule(schedule)
    streams: dict[QueueKey, list[OpKey]] = {}
    by_device = schedule.by_device()
    for device, own in enumerate(by_device):
        for op in own:
            streams.setdefault((device, op.stream), []).append(op.order_key)
    fractions = {op.key: op.fraction for op in schedule.ops if op.fraction != 1.0}
    pairs = {op.order_key: op.partner for op in schedule.ops if op.partner is not None}
    slack = time_slack(schedule.ops)
    waits = [wait for own in by_device for wait in _device_waits(own, slack)]
    return Order(
        problem=schedule.problem,
        streams=streams,
        fractions=fractions,
        pairs=pairs,
        waits=tuple(waits),
        variant=schedule.variant,
        name=schedule.solver.name,
    )


def _device_waits(own: Sequence[ScheduledOp], slack: float) -> list[tuple[OpKey, OpKey]]:
    """Cross-stream waits of one device's ops (in execution order).

    For each op and each other stream of its device, the last op there that ended at or
    before this op's start (as :func:`pp_opt.time_rule.counts_before` says: up to the
    time slack after it counts) and comes before it in execution order (earlier ones follow
    from the stream order): re-timing with these never raises the memory peak nor the
    objective (every start can only move earlier, and every free that preceded an
    allocation still precedes it). Waits only point forward in execution order, so
    zero-time ops (copies of a problem without copy costs) that start and end at the
    same instant never wait on each other in a cycle.
    """
    by_stream: dict[Stream, list[ScheduledOp]] = {}
    for op in own:
        by_stream.setdefault(op.stream, []).append(op)
    if len(by_stream) < 2:
        return []
    position = {id(op): i for i, op in enumerate(own)}
    # Per stream, its ops sorted by end (stable: ties keep execution order) and the ends.
    ended = {stream: sorted(ops, key=lambda o: o.end) for stream, ops in by_stream.items()}
    ends = {stream: [o.end for o in ops] for stream, ops in ended.items()}
    waits = []
    for op in own:
        here = position[id(op)]
        for stream, others in ended.items():
            if stream is op.stream:
                continue
            # Ops that end by op's start, as the time rule counts it (docs/design.md §5).
            count = bisect_left(
                ends[stream], True, key=lambda e: not counts_before(e, op.start, slack)
            )
            while count and position[id(others[count - 1])] > here:
                count -= 1  # ends at op's start but runs after it: a zero-time op
            if count:
                # The first op (in execution order) among those ending last before op.
                latest = bisect_left(ends[stream], ends[stream][count - 1])
                waits.append((others[latest].order_key, op.order_key))
    return waits


def retime(schedule: Schedule, *, solver: SolverInfo | None = None) -> Schedule:
    """Re-time a schedule's own op order and cross-stream waits with the simulator."""
    a_schedule(schedule)
    a_solver_info(solver)
    return simulate(order_of(schedule), solver=solver)


def align(schedule: Schedule) -> Schedule:
    """The schedule with the times that are meant to be equal written equal (docs/design.md §5).

    An op that starts within the time rule's slack of an end it waits for (a DAG
    predecessor's end plus its latency, an op of its own device, the copy before it on a
    shared host link) starts at exactly that end, the latest of them, and its end moves
    with it. A solver's times read back from scaled integers and re-timed in parts (the
    search's windows) give ``11.4 + 0.3 = 11.700000000000001`` for a W and ``11.7`` for the
    forward after it; aligned, reading the file needs no tolerance. Starts move by no more
    than the slack, so a valid schedule stays valid. The schedule itself comes back when
    nothing moves; otherwise with its metrics recomputed.
    """
    problem = schedule.problem
    slack = time_slack(schedule.ops)
    lag = stage_latency(problem)
    preds: dict[OpKey, list[OpKey]] = {}
    for u, after in successors(dag_for(problem, schedule.variant)).items():
        for w in after:
            preds.setdefault(w, []).append(u)
    ends: dict[OpKey, tuple[float, float]] = {}  # each op's end: (as given, as aligned)
    running: dict[object, list[tuple[float, float]]] = {}  # ends not yet behind the sweep
    latest: dict[object, tuple[float, float]] = {}  # the op before, per stream and link
    moved: dict[int, ScheduledOp] = {}
    for op in sorted(schedule.ops, key=execution_order_key):
        device = problem.device_of(op.stage)
        resource = resource_of(problem, device, op.stream)
        lanes: list[object] = [(device, op.stream)]
        if resource[0] == "link":
            lanes.append(resource)
        halves = [h.key for h in op.halves()]
        anchors = [(ends[u][0] + lag(u.stage, k.stage), ends[u][1] + lag(u.stage, k.stage))
                   for k in halves for u in preds.get(k, ()) if u in ends]  # fmt: skip
        anchors += [latest[lane] for lane in lanes if lane in latest]
        for pool in (device, *lanes[1:]):
            near = [e for e in running.get(pool, ()) if e[0] >= op.start - slack]
            running[pool] = near
            anchors += near
        start = max((new for old, new in anchors if abs(old - op.start) <= slack),
                    default=op.start)  # fmt: skip
        start = max([start, *(new for old, new in anchors if old <= op.start + slack)])
        end = op.end if start == op.start else start + (op.end - op.start)
        if start != op.start:
            moved[id(op)] = replace(op, start=start, end=end)
        for k in halves:
            ends[k] = (op.end, end)
        for pool in (device, *lanes[1:]):
            running.setdefault(pool, []).append((op.end, end))
        for lane in lanes:
            if lane not in latest or latest[lane][0] <= op.end:
                latest[lane] = (op.end, end)
    if not moved:
        return schedule
    ops = tuple(moved.get(id(op), op) for op in schedule.ops)
    return replace(schedule, ops=ops, metrics=compute_metrics(problem, ops))


def _durations(problem: Problem) -> dict[tuple[OpKind, int], float]:
    """:func:`~pp_opt.ops.duration` of every (kind, stage) of whole-activation ops."""
    return {
        (kind, stage): duration(problem, kind, stage)
        for kind, row in KINDS.items()
        if row.cost is not None
        for stage in range(problem.num_stages)
    }


def _stream_rank(stream: Stream) -> int:
    return STREAM_ORDER.index(stream)


def _link_key(problem: Problem, qk: QueueKey) -> QueueKey | None:
    resource = resource_of(problem, *qk)
    return None if resource[0] == "device" else (resource[1], qk[1])


def _edges(
    problem: Problem,
    dag: nx.DiGraph,
    present: set[OpKey],
    waits: Iterable[tuple[OpKey, OpKey]],
    pairs: Mapping[OpKey, OpKey],
) -> tuple[dict[OpKey, list[tuple[OpKey, float]]], dict[OpKey, list[OpKey]]]:
    """Predecessors (with latency) and successors among present ops, waits included.

    A pair is one node (its ``F`` key): it waits for what either half waits for, and what
    waits for either half waits for it."""
    node = {back: f for f, back in pairs.items()}
    preds: dict[OpKey, list[tuple[OpKey, float]]] = {k: [] for k in present if k not in node}
    succs: dict[OpKey, list[OpKey]] = {key: [] for key in preds}
    adjacency = successors(dag)
    lag = stage_latency(problem)
    everything = len(present) == len(adjacency)  # no optional op left out: no membership tests
    for u, after in adjacency.items():  # DAG order: every run lists the same edges alike
        if not everything and u not in present:
            continue
        out = succs[node.get(u, u)] if node else succs[u]
        for w in after:
            if everything or w in present:
                if node and node.get(w, w) == node.get(u, u):
                    pair = node.get(u, u)
                    raise ProblemError("pairs", f"the pair of {pair} holds {u} and {w}, "
                                       "which waits for it; pair independent ops")  # fmt: skip
                preds[node.get(w, w) if node else w].append((u, lag(u.stage, w.stage)))
                out.append(node.get(w, w) if node else w)
    for u, w in waits:
        if u not in preds or w not in preds:
            raise ProblemError("waits", f"{u} -> {w} names an op that is not in the order")
        preds[w].append((u, 0.0))
        succs[u].append(w)
    if node:  # a pair's end is its F key's: what waits for the backward half waits for it
        for waited in preds.values():
            waited[:] = [(node.get(u, u), lag_) for u, lag_ in waited]
    return preds, succs


def _check_order(
    problem: Problem, dag: nx.DiGraph, order: Streams, pairs: Mapping[OpKey, OpKey]
) -> set[OpKey]:
    present: set[OpKey] = set()
    devices = [problem.device_of(s) for s in range(problem.num_stages)]
    streams = {kind: stream_of(kind) for kind in OpKind}
    for (device, stream), keys in order.items():
        for key in keys:
            if key not in dag:
                raise ProblemError("order", f"{key} is not an op of this problem")
            if key in present:
                raise ProblemError("order", f"{key} is listed twice; list each op once")
            if devices[key.stage] != device or streams[key.kind] is not stream:
                raise ProblemError(
                    "order",
                    f"{key} is listed on device {device} {stream.value}; it runs on device "
                    f"{problem.device_of(key.stage)} {stream_of(key.kind).value}",
                )
            present.add(key)
    for f, back in pairs.items():
        if f.kind is not OpKind.F or f not in present or back.kind not in BACKWARD_KINDS:
            raise ProblemError("pairs", f"{f} with {back}: pair a listed F with a B or BW")
        if back not in dag or back in present or devices[back.stage] != devices[f.stage]:
            raise ProblemError("pairs", f"{back} (paired with {f}) is not an op of its device "
                               "listed nowhere else")  # fmt: skip
        present.add(back)
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
    queues: Mapping[QueueKey, Sequence[OpKey]],
    position: Mapping[QueueKey, int],
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
