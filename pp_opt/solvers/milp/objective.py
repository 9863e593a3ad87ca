"""The objective: ``makespan`` or ``span`` (docs/design.md §4), with load bounds for the LP."""

from __future__ import annotations

import pulp

from pp_opt.ops import Resource, Stream
from pp_opt.solvers.milp.variables import Hint, MilpModel, OpVars, WarmValues


def set_objective(model: MilpModel, *, bound: float | None = None) -> None:
    """Minimise the chosen objective; ``bound`` caps it (a known schedule's value)."""
    value = _makespan(model) if model.objective == "makespan" else _span(model)
    model.lp += value
    if bound is not None:
        model.lp += value <= bound, "warm_start_bound"


def _makespan(model: MilpModel) -> pulp.LpVariable:
    """Last end; starts are at least 0, and an optimum starts at 0 (shift it)."""
    ops, graph = model.vars.ops, model.graph
    makespan = model.vars.continuous("makespan", 0.0, model.horizon, _hint_makespan)
    for key, op in ops.items():
        if not graph.succ[key]:
            model.lp += makespan >= op.end
    # Ops of one resource run one at a time between their earliest start and the
    # shortest tail after the last of them: a cut the big-M relaxation misses.
    for ops_on in _by_resource(model).values():
        load = pulp.lpSum(o.duration for o in ops_on) - _pairs_counted_twice(model, ops_on)
        head = min(o.earliest for o in ops_on)
        tail = min(model.horizon - o.latest - (0.0 if o.optional else o.max_duration)
                   for o in ops_on)  # fmt: skip
        model.lp += makespan >= head + load + max(tail, 0.0)
    return makespan


def _span(model: MilpModel) -> pulp.LpVariable:
    """Largest per-device span: last end minus first start over the device's ops."""
    problem, ops, dag = model.problem, model.vars.ops, model.dag
    span = model.vars.continuous("span", 0.0, model.horizon, _hint_span)
    for device in range(problem.p):
        own = [o for o in ops.values() if o.device == device]
        first = model.vars.continuous("first", 0.0, model.horizon, _hint_first(device))
        last = model.vars.continuous("last", 0.0, model.horizon, _hint_last(device))
        for op in own:
            if all(ops[u].device != device for u in dag.pred[op.key]):
                model.lp += first <= op.start
            if all(ops[w].device != device for w in dag.succ[op.key]):
                model.lp += last >= op.end
        model.lp += span >= last - first
        compute = [o for o in own if o.resource[2] is Stream.COMPUTE]
        model.lp += span >= pulp.lpSum(o.duration for o in compute) - _pairs_counted_twice(
            model, compute
        )
    return span


def _pairs_counted_twice(model: MilpModel, ops_on: list[OpVars]) -> object:
    """The time of each chosen pair among ``ops_on``: both halves last it, the stream holds
    it once."""
    keys = {o.key for o in ops_on}
    return pulp.lpSum(size * x for (f, b), (x, size) in model.vars.pairs.items() if f in keys)


def _by_resource(model: MilpModel) -> dict[Resource, list[OpVars]]:
    groups: dict[Resource, list[OpVars]] = {}
    for op in model.vars.ops.values():
        groups.setdefault(op.resource, []).append(op)
    return groups


def _hint_makespan(warm: WarmValues, _values: dict[str, float]) -> float:
    return max(warm.end[k] for k in warm.present)


def _hint_span(warm: WarmValues, _values: dict[str, float]) -> float:
    return max(warm.span)


def _hint_first(device: int) -> Hint:
    return lambda warm, _values: warm.first[device]


def _hint_last(device: int) -> Hint:
    return lambda warm, _values: warm.last[device]
