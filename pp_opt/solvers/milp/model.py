"""The MILP model: ops as start-time variables, built in a fixed order of constraint families.

A time-indexed model would be exact but huge; this one is the classic disjunctive
formulation (one order binary per pair of ops that share a stream) with the
memory cap checked at every allocation, which is where memory peaks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import pulp

from pp_opt.ops import OpKey, OpKind, Stream, memory_delta
from pp_opt.problem import Problem
from pp_opt.solvers.milp import constraints, objective
from pp_opt.solvers.milp.variables import (
    OpVars,
    Resource,
    Variables,
    hint_offload,
    hint_recompute,
    hint_start,
)

SYMMETRIC_KINDS = (OpKind.F, OpKind.B, OpKind.W, OpKind.BW)


@dataclass(kw_only=True, slots=True)
class MilpModel:
    """A built model and what reading its solution back needs."""

    problem: Problem
    dag: nx.DiGraph
    lp: pulp.LpProblem
    vars: Variables
    horizon: float
    objective: str
    symmetry: bool
    fractions: tuple[float, ...]
    graph: nx.DiGraph = field(repr=False)
    """The DAG plus the symmetry-breaking chains: every precedence the model enforces."""
    chains: list[tuple[OpKey, OpKey]] = field(default_factory=list)
    """Symmetry breaking: ``(u, w)`` with ``u`` the previous microbatch's op of ``w``'s kind."""
    reach: dict[OpKey, set[OpKey]] = field(repr=False, default_factory=dict)
    infeasible: bool = False
    """Set when a constraint without variables fails (a cap below what precedences force)."""
    """``reach[u]``: ops that start only after ``u`` ends, in every schedule of the model."""


def build_model(
    problem: Problem,
    dag: nx.DiGraph,
    *,
    objective_name: str,
    horizon: float,
    fractions: tuple[float, ...],
    objective_bound: float | None = None,
    symmetry: bool = True,
) -> MilpModel:
    """Build the MILP of ``dag`` with start times in ``[0, horizon]``.

    ``objective_bound`` (the warm start's value) caps the objective: the answer
    is never worse than the warm start anyway, and the cap prunes the search.
    """
    lp = pulp.LpProblem("pp_opt", pulp.LpMinimize)
    model = MilpModel(
        problem=problem,
        dag=dag,
        lp=lp,
        vars=Variables(lp=lp),
        horizon=horizon,
        objective=objective_name,
        symmetry=symmetry,
        fractions=fractions,
        graph=nx.DiGraph(dag),
    )
    _activation_variables(model)
    _op_variables(model)
    if symmetry:
        _add_symmetry_edges(model)
    _time_windows(model)
    # The constraint families, in this order (later ones reuse the binaries of earlier ones):
    constraints.activation_choice(model)  # keep, offload (one fraction) or recompute
    constraints.precedence(model)  # DAG edges with their latency
    constraints.symmetry(model)  # same-kind ops of a stage in microbatch order
    constraints.disjunctive(model)  # one op at a time per stream / shared host link
    constraints.memory(model)  # cap minus static memory at every allocation
    objective.set_objective(model, bound=objective_bound)
    return model


def _activation_variables(model: MilpModel) -> None:
    """Offload-fraction and recompute binaries, one set per activation that allows them."""
    dag, v = model.dag, model.vars
    for key in dag.nodes:
        act = (key.stage, key.microbatch)
        if key.kind is OpKind.OFFLOAD:
            v.offload[act] = [
                (f, v.binary("off", hint_offload(key.stage, key.microbatch, f)))
                for f in model.fractions
            ]
        elif key.kind is OpKind.R:
            v.recompute[act] = v.binary("rec", hint_recompute(key.stage, key.microbatch))


def _op_variables(model: MilpModel) -> None:
    problem, v = model.problem, model.vars
    for key, data in model.dag.nodes(data=True):
        duration, presence, max_duration = _duration_and_presence(model, key, data["duration"])
        v.ops[key] = OpVars(
            key=key,
            device=data["device"],
            resource=_resource(problem, data["device"], data["stream"]),
            start=v.continuous("s", 0.0, model.horizon, hint_start(key)),
            duration=duration,
            max_duration=max_duration,
            presence=presence,
            optional=bool(data["optional"]),
        )


def _duration_and_presence(
    model: MilpModel, key: OpKey, full: float
) -> tuple[object, object, float]:
    """Duration and presence as expressions of the activation's choice binaries."""
    v, act = model.vars, (key.stage, key.microbatch)
    if key.kind in (OpKind.OFFLOAD, OpKind.RELOAD):
        choices = v.offload[act]
        duration = pulp.lpSum(f * full * z for f, z in choices)
        return duration, pulp.lpSum(z for _, z in choices), max(f for f, _ in choices) * full
    if key.kind is OpKind.R:
        r = v.recompute[act]
        return full * r, r, full
    return full, 1, full


def _resource(problem: Problem, device: int, stream: Stream) -> Resource:
    """Copies of devices that share a host link share one resource per direction."""
    if stream is not Stream.COMPUTE:
        group = problem.link_group(device)
        if group is not None:
            return ("link", group, stream)
    return ("device", device, stream)


def _add_symmetry_edges(model: MilpModel) -> None:
    """The microbatch-order chains of ``constraints.symmetry``, also used as precedences."""
    v = model.vars
    if v.offload or v.recompute:
        kinds: tuple[OpKind, ...] = (OpKind.F,)
        stages: range = range(1)
    else:
        kinds, stages = SYMMETRIC_KINDS, range(model.problem.num_stages)
    for key in model.dag.nodes:
        if key.kind in kinds and key.stage in stages and key.microbatch > 0:
            prev = OpKey(key.kind, key.stage, key.microbatch - 1)
            model.chains.append((prev, key))
            model.graph.add_edge(prev, key, latency=0.0)


def _time_windows(model: MilpModel) -> None:
    """Earliest and latest starts from longest paths (optional ops may take no time)."""
    graph, ops = model.graph, model.vars.ops
    order = list(nx.topological_sort(graph))
    least = {k: 0.0 if ops[k].optional else ops[k].max_duration for k in order}
    for key in order:
        preds = graph.pred[key]
        ops[key].earliest = max(
            (ops[u].earliest + least[u] + preds[u]["latency"] for u in preds), default=0.0
        )
    tail: dict[OpKey, float] = {}
    for key in reversed(order):
        succs = graph.succ[key]
        tail[key] = least[key] + max((succs[w]["latency"] + tail[w] for w in succs), default=0.0)
        ops[key].latest = max(ops[key].earliest, model.horizon - tail[key])
    reach: dict[OpKey, set[OpKey]] = {}
    for key in reversed(order):
        below: set[OpKey] = set()
        for w in graph.succ[key]:
            below.add(w)
            below |= reach[w]
        reach[key] = below
    model.reach = reach


def allocation_amount(model: MilpModel, key: OpKey) -> tuple[float, list[tuple[float, Any]]]:
    """Memory an op allocates at its start: a constant plus ``coef * binary`` terms."""
    problem, v, act = model.problem, model.vars, (key.stage, key.microbatch)
    if key.kind is OpKind.F:
        kept = memory_delta(problem, OpKind.F, key.stage)[0]
        if act not in v.recompute:
            return kept, []
        only_input = memory_delta(problem, OpKind.F, key.stage, recomputed=True)[0]
        return kept, [(only_input - kept, v.recompute[act])]
    if key.kind is OpKind.R:
        return 0.0, [(memory_delta(problem, OpKind.R, key.stage)[0], v.recompute[act])]
    if key.kind is OpKind.RELOAD:
        return 0.0, [
            (memory_delta(problem, OpKind.RELOAD, key.stage, fraction=f)[0], z)
            for f, z in v.offload[act]
        ]
    return 0.0, []


def free_amount(model: MilpModel, key: OpKey) -> tuple[float, list[tuple[float, Any]]]:
    """Memory an op frees at its end, in the same form as :func:`allocation_amount`."""
    problem, act = model.problem, (key.stage, key.microbatch)
    if key.kind is OpKind.OFFLOAD:
        return 0.0, [
            (-memory_delta(problem, OpKind.OFFLOAD, key.stage, fraction=f)[1], z)
            for f, z in model.vars.offload[act]
        ]
    return -memory_delta(problem, key.kind, key.stage)[1], []
