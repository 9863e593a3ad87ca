"""The MILP model: variables, constraint families in a fixed order, objective.

The same parts as the CP-SAT's :mod:`pp_opt.solvers.cpsat.model`: :func:`build_model`
creates the variables (:mod:`.variables`), adds each constraint family
(:mod:`.constraints`) and the objective (:mod:`.objective`); warm-start values are set
by :mod:`.warm`.

A time-indexed model would be exact but huge; this one is the classic disjunctive
formulation (one order binary per pair of ops that share a stream) with the
memory cap checked at every allocation, which is where memory peaks.
"""

from __future__ import annotations

import networkx as nx
import pulp

import pp_opt.solvers.milp.constraints as constraints
import pp_opt.solvers.milp.objective as objective
from pp_opt.ops import OpKey, OpKind
from pp_opt.problem import Problem
from pp_opt.runtime_rules import loss_stage, runtime_chains
from pp_opt.solvers.base import check_time
from pp_opt.solvers.milp.variables import MilpModel, OpVars, Variables, create_variables

SYMMETRIC_KINDS = (OpKind.F, OpKind.B, OpKind.W, OpKind.BW)


def build_model(
    problem: Problem,
    dag: nx.DiGraph,
    *,
    objective_name: str,
    horizon: float,
    fractions: tuple[float, ...],
    objective_bound: float | None = None,
    symmetry: bool = True,
    deadline: float | None = None,
) -> MilpModel:
    """Build the MILP of ``dag`` with start times in ``[0, horizon]``.

    ``objective_bound`` (the warm start's value) caps the objective: the answer
    is never worse than the warm start anyway, and the cap prunes the search.
    Raises :class:`OutOfTime` between steps once ``time.perf_counter()`` passes
    ``deadline``.
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
    create_variables(model)
    _add_runtime_edges(model)
    if symmetry:
        _add_symmetry_edges(model)
    _time_windows(model)
    check_time(deadline)
    # The constraint families, in this order (later ones reuse the binaries of earlier ones):
    constraints.activation_choice(model)  # keep, offload (one fraction) or recompute
    constraints.precedence(model)  # DAG edges with their latency
    constraints.pairs(model)  # an overlapped pair's halves start together, each in one pair
    constraints.symmetry(model)  # runtime order rules; same-kind ops in microbatch order
    check_time(deadline)
    constraints.disjunctive(model)  # one op at a time per stream / shared host link
    check_time(deadline)
    constraints.memory(model)  # cap minus static memory at every allocation
    check_time(deadline)
    objective.set_objective(model, bound=objective_bound)
    return model


def _add_chain(model: MilpModel, prev: OpKey, key: OpKey) -> None:
    if not model.graph.has_edge(prev, key):
        model.chains.append((prev, key))
        model.graph.add_edge(prev, key, latency=0.0)


def _add_runtime_edges(model: MilpModel) -> None:
    """The runtimes' order rules (:func:`pp_opt.runtime_rules.runtime_chains`), kept with or
    without symmetry breaking: chains of ``constraints.symmetry``, also used as precedences."""
    for prev, key in runtime_chains(model.problem):
        if prev in model.dag and key in model.dag:
            _add_chain(model, prev, key)


def _add_symmetry_edges(model: MilpModel) -> None:
    """The microbatch-order chains of ``constraints.symmetry``, also used as precedences.

    With offload or recompute only the last stage's forwards (the runtimes' own rule);
    see ``constraints.symmetry``.
    """
    v = model.vars
    if v.offload or v.recompute:
        kinds: tuple[OpKind, ...] = (OpKind.F,)
        last = loss_stage(model.problem)
        stages: range = range(last, last + 1)
    else:
        kinds, stages = SYMMETRIC_KINDS, range(model.problem.num_stages)
    for key in model.dag.nodes:
        if key.kind in kinds and key.stage in stages and key.microbatch > 0:
            _add_chain(model, OpKey(key.kind, key.stage, key.microbatch - 1), key)


def _time_windows(model: MilpModel) -> None:
    """Earliest and latest starts from longest paths (optional ops may take no time)."""
    graph, ops = model.graph, model.vars.ops
    order = list(nx.topological_sort(graph))
    least = {k: _least(ops[k]) for k in order}
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


def _least(op: OpVars) -> float:
    """The shortest time an op takes: none for optional ones (absent), its own time alone
    for a half of a candidate pair."""
    if op.optional:
        return 0.0
    return op.max_duration if op.least is None else op.least
