"""The warm start as CP-SAT hints: its op order timed in model units, every variable hinted."""

from __future__ import annotations

import logging

import networkx as nx
from ortools.sat.python import cp_model

from pp_opt.ops import OpKey, OpKind, Stream
from pp_opt.order import Order
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, dag_ops
from pp_opt.simulator import order_of, simulate
from pp_opt.solvers.cpsat.exchange import exchange_rules, in_exchange_order
from pp_opt.solvers.cpsat.pairs import hint_pairs
from pp_opt.solvers.cpsat.variables import OpVar, Variables
from pp_opt.solvers.cpsat.w_order import in_w_order, w_class

log = logging.getLogger(__name__)


def warm_times(
    warm: Schedule | None, problem: Problem, scaled: Problem, dag: nx.DiGraph
) -> Schedule | None:
    """The warm start's op order timed in model units, mapped onto the DAG's op kinds."""
    if warm is None:
        return None
    if [s.device for s in warm.problem.stages] != [s.device for s in problem.stages]:
        log.info("warm start ignored: its placement differs from the problem's")
        return None
    split = bool(dag.graph.get("split_backward"))
    order: dict[tuple[int, Stream], list[OpKey]] = {}
    pairs: dict[OpKey, OpKey] = {}
    for device, own in enumerate(warm.by_device()):
        for op in own:
            keys = [op.order_key]  # a pair: its F key stands for it (Order.pairs)
            if op.partner is not None:
                back = op.partner
                pairs[op.order_key] = back._replace(kind=OpKind.B if split else OpKind.BW)
                if split and back.kind is OpKind.BW:  # the W of a fused half right after
                    keys.append(OpKey(OpKind.W, back.stage, back.microbatch))
            elif split and op.kind is OpKind.BW:
                keys = [
                    OpKey(OpKind.B, op.stage, op.microbatch),
                    OpKey(OpKind.W, op.stage, op.microbatch),
                ]
            elif not split and op.kind in (OpKind.B, OpKind.W):
                keys = [OpKey(OpKind.BW, op.stage, op.microbatch)] if op.kind is OpKind.B else []
            order.setdefault((device, op.stream), []).extend(keys)
    if not dag.graph.get("offload") and not dag.graph.get("recompute") and not pairs:
        # The model keeps the slot exchanges' orders (exchange) and runs alike W in their
        # backwards' order (w_order): so does the hint, in that order.
        rules = exchange_rules(problem, split=split)
        alike = w_class(problem)
        for (device, stream), keys in order.items():
            if stream is Stream.COMPUTE:
                keys = in_exchange_order(keys, rules)
                order[(device, stream)] = in_w_order(keys, alike) if split else keys
    given = order_of(warm)
    waits = tuple((u, w) for u, w in given.waits if u in dag and w in dag)
    mapped = Order(problem=scaled, streams=order, fractions=given.fractions, waits=waits,
                   pairs=pairs, variant=dag.graph["variant"])  # fmt: skip
    try:
        # The DAG's structure is the scaled problem's too; latencies come from ``scaled``.
        return simulate(mapped, dag=dag)
    except Exception as err:  # a hint is only a hint: never let it stop the solve
        log.info("warm start ignored: %s", err)
        return None


def objective_of(schedule: Schedule, objective: str) -> int:
    return int(round(schedule.objective_value(objective)))


def add_hints(
    model: cp_model.CpModel, v: Variables, warm: Schedule, obj: cp_model.IntVar, objective: str
) -> None:
    """Hint every variable (a complete hint is far more useful to CP-SAT than a partial one)."""
    timed = {op.key: op for op in dag_ops(warm.ops)}  # a pair's halves at the pair's times
    hint_pairs(model, v, {(op.order_key, op.partner) for op in warm.ops if op.partner})
    start: dict[int, int] = {}
    end: dict[int, int] = {}  # where it differs from start + size: halves of pairs

    def hint_op(op_var: OpVar, value: float) -> None:
        start[id(op_var)] = int(round(value))
        model.add_hint(op_var.start, start[id(op_var)])

    for key, op in v.ops.items():
        if key in timed:
            hint_op(op, timed[key].start)
            if op.end_var is not None:
                end[id(op)] = int(round(timed[key].end))
                model.add_hint(op.end_var, end[id(op)])
        if op.present is not None:
            model.add_hint(op.present, key in timed)
    for (s, j), choices in v.offloads.items():
        moved = timed.get(OpKey(OpKind.OFFLOAD, s, j))
        back = timed.get(OpKey(OpKind.RELOAD, s, j))
        chosen = None
        if moved is not None and back is not None:  # both present or neither (simulator)
            chosen = min(choices, key=lambda c: abs(c.fraction - moved.fraction))
        for c in choices:
            model.add_hint(c.literal, c is chosen)
            if c is chosen and moved is not None and back is not None:
                hint_op(c.offload, moved.start)
                hint_op(c.reload, back.start)
    for (s, j), keep in v.keep.items():
        changed = OpKey(OpKind.OFFLOAD, s, j) in timed or OpKey(OpKind.R, s, j) in timed
        model.add_hint(keep, not changed)
    for size, alloc, free in v.lifetimes:
        if id(alloc[0]) in start and id(free[0]) in start:
            a, b = (_hinted(ref, start, end) for ref in (alloc, free))
            model.add_hint(size, max(0, b - a))
    for (earlier, later), lit in v.orders.items():
        if earlier in timed and later in timed:
            model.add_hint(lit, timed[earlier].end <= timed[later].start + 1e-9)
    by_device = warm.by_device()
    for device, (first, last) in v.span_vars.items():
        own = by_device[device]
        model.add_hint(
            first, 0 if objective == "makespan" else int(round(min(op.start for op in own)))
        )
        model.add_hint(last, int(round(max(op.end for op in own))))
    model.add_hint(obj, objective_of(warm, objective))


def _hinted(ref: tuple[OpVar, bool], start: dict[int, int], end: dict[int, int]) -> int:
    """The hinted time of an op's start, or of its end (a pair's end for its halves)."""
    op, at_end = ref
    if not at_end:
        return start[id(op)]
    return end.get(id(op), start[id(op)] + op.size)
