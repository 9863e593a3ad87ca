"""The CP-SAT model: variables, constraint families in a fixed order, objective, hints.

The same parts as the MILP's :mod:`pp_opt.solvers.milp.model`: :func:`build_model`
creates the variables (:mod:`.variables`), adds each constraint family
(:mod:`.constraints`) and the objective (:mod:`.objective`), and hints the warm start
(:mod:`.warm`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx
from ortools.sat.python import cp_model

from pp_opt.problem import Problem
from pp_opt.solvers.base import SolveOptions, check_time
from pp_opt.solvers.cpsat.constraints import (
    add_choices,
    add_memory,
    add_no_overlap,
    add_precedences,
    add_runtime_order,
    add_symmetry_breaking,
    symmetry_chains,
)
from pp_opt.solvers.cpsat.memory_order import with_orders
from pp_opt.solvers.cpsat.objective import add_heads_and_tails, add_objective
from pp_opt.solvers.cpsat.pairs import add_pairs
from pp_opt.solvers.cpsat.scaling import Scaling, choose_scaling
from pp_opt.solvers.cpsat.sequence import (
    add_memory_orders,
    add_sequence_memory,
    uses_sequence_memory,
)
from pp_opt.solvers.cpsat.variables import (
    Variables,
    create_variables,
    scaled_problem,
    serial_horizon,
)
from pp_opt.solvers.cpsat.warm import add_hints, objective_of, warm_times
from pp_opt.solvers.pairing import candidates, complete


@dataclass(kw_only=True, slots=True)
class CpsatModel:
    """A built model and what solving and reading it back need."""

    model: cp_model.CpModel
    vars: Variables
    objective: cp_model.IntVar
    scaling: Scaling
    sequence_memory: bool = False
    """Whether the memory is modelled over the op sequence (:mod:`.sequence`)."""
    upper: int | None = None
    """The warm start's objective (model units), which bounds the model's; None without one."""
    complete: bool = True
    """Whether the model holds every schedule of the problem: False where it may pair ops
    but holds only a window of the pairs (:func:`.pairs.complete`), so that its optimum and
    bound are those of a restricted problem."""


def build_model(
    problem: Problem,
    dag: nx.DiGraph,
    options: SolveOptions,
    *,
    deadline: float | None = None,
    bound: float | None = None,
) -> CpsatModel:
    """The CP-SAT model of ``dag`` (times in the integer units of :func:`choose_scaling`).

    A warm start, timed in model units, bounds the objective (and the horizon, for
    ``makespan``) and hints every variable. ``bound`` (problem units, e.g. from
    :mod:`.relaxation`) bounds the objective from below when the scale is exact.
    Raises :class:`OutOfTime` between steps once ``time.perf_counter()`` passes
    ``deadline``.
    """
    fractions = tuple(options.offload_fractions) if dag.graph.get("offload") else ()
    scaling = choose_scaling(problem, fractions or (1.0,))
    scaled = scaled_problem(problem, scaling)
    horizon = serial_horizon(scaled, dag, fractions or (1.0,))
    warm = warm_times(options.warm_start, problem, scaled, dag)
    check_time(deadline)
    upper = None
    if warm is not None:
        upper = objective_of(warm, options.objective)
        if options.objective == "makespan":
            horizon = min(horizon, upper)
    model = cp_model.CpModel()
    v = create_variables(model, problem, dag, scaling, horizon=horizon, fractions=fractions)
    pairs = candidates(v.scaled, dag)
    add_pairs(model, v, pairs)  # first: the ends of paired ops are variables from here on
    # Constraint families, in this order: the choice per activation, the DAG
    # precedences, the runtimes' order rules, one op per stream, the memory caps, then
    # symmetry breaking.
    add_choices(model, v)
    check_time(deadline)
    add_precedences(model, v, dag)
    add_runtime_order(model, v)
    check_time(deadline)
    add_no_overlap(model, v)
    check_time(deadline)
    sequence = _sequence_memory(options.memory_model, v)  # never with pairs (its orders
    # assume that a device's compute ops never overlap; a pair's halves do)
    paths = dag
    if sequence:
        chains = symmetry_chains(v)
        forced = add_memory_orders(model, v, dag, chains)
        add_sequence_memory(model, v, dag, chains + forced)
        # Heads and tails through the orders every schedule keeps (memory_order's docstring).
        paths = with_orders(dag, chains + forced)
    else:
        add_memory(model, v)
    check_time(deadline)
    add_symmetry_breaking(model, v)
    check_time(deadline)
    lower = None
    if bound is not None and scaling.exact:
        lower = math.ceil(bound * scaling.time - 1e-6)
    obj = add_objective(model, v, options.objective, upper=upper, lower=lower)
    if options.objective == "makespan":
        add_heads_and_tails(model, v, paths, obj)
    if warm is not None:
        add_hints(model, v, warm, obj, options.objective)
    return CpsatModel(model=model, vars=v, objective=obj, scaling=scaling, sequence_memory=sequence,
                      upper=upper, complete=not pairs or complete(problem))  # fmt: skip


def _sequence_memory(choice: str, v: Variables) -> bool:
    """Whether the memory is modelled over the op sequence (:mod:`.sequence`)."""
    if choice not in ("auto", "sequence", "cumulative"):
        raise ValueError(f"memory_model {choice!r} is unknown; use 'auto', 'sequence' or "
                         "'cumulative'")  # fmt: skip
    if choice == "cumulative":
        return False
    applies = uses_sequence_memory(v) and not v.pairs
    if choice == "sequence" and not applies:
        raise ValueError("memory_model 'sequence' needs a problem without offload and "
                         "recompute; use 'auto' or 'cumulative'")  # fmt: skip
    return applies
