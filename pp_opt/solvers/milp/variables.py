"""Decision variables of the MILP: op starts, activation choices, order binaries.

Every binary is registered with a *hint*: a function of a warm-start schedule
that gives its value there, so a warm start sets every variable consistently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import pulp

from pp_opt.ops import OpKey, OpKind, Resource, pair_time, resource_of
from pp_opt.problem import Problem
from pp_opt.solvers.pairing import candidates

Expr = Any
"""A PuLP linear expression, a variable or a plain number."""


@dataclass(kw_only=True, slots=True)
class WarmValues:
    """A warm-start schedule as the hints see it (every op present or not, with times)."""

    start: dict[OpKey, float]
    end: dict[OpKey, float]
    present: set[OpKey]
    fraction: dict[tuple[int, int], float]
    """Offloaded fraction per ``(stage, microbatch)`` (absent when kept)."""
    recomputed: set[tuple[int, int]]
    first: list[float]
    """First start per device (present ops)."""
    last: list[float]
    """Last end per device (present ops)."""
    pairs: set[tuple[OpKey, OpKey]] = field(default_factory=set)
    """Its overlapped pairs: ``(F key, backward key)``."""

    @property
    def span(self) -> list[float]:
        return [b - a for a, b in zip(self.first, self.last, strict=True)]


Hint = Callable[[WarmValues, dict[str, float]], float]
"""Value of a variable in a warm start; the dict holds the hints already computed."""


@dataclass(kw_only=True, slots=True)
class OpVars:
    """One op of the DAG in the model."""

    key: OpKey
    device: int
    resource: Resource
    start: pulp.LpVariable
    duration: Expr
    """Time it occupies its stream (an expression for copies and recompute)."""
    max_duration: float
    presence: Expr
    """1 for required ops; the choice binaries' sum for optional ones."""
    optional: bool
    earliest: float = 0.0
    latest: float = 0.0
    """Latest start in any schedule that ends by the horizon (set by the model)."""
    least: float | None = None
    """Its shortest duration where that is not ``max_duration`` (a half of a candidate
    pair runs its own time alone, the pair's time in the pair)."""

    @property
    def end(self) -> Expr:
        return self.start + self.duration


@dataclass(kw_only=True, slots=True)
class Variables:
    """All variables, created where needed and named so a model file reads well."""

    ops: dict[OpKey, OpVars] = field(default_factory=dict)
    offload: dict[tuple[int, int], list[tuple[float, pulp.LpVariable]]] = field(
        default_factory=dict
    )
    """Per activation, one binary per allowed fraction (at most one is 1)."""
    recompute: dict[tuple[int, int], pulp.LpVariable] = field(default_factory=dict)
    order: dict[tuple[OpKey, OpKey], Expr] = field(default_factory=dict)
    """``order[u, w]`` is 1 when ``u`` runs before ``w`` on their shared resource."""
    started: dict[tuple[OpKey, OpKey], pulp.LpVariable] = field(default_factory=dict)
    pairs: dict[tuple[OpKey, OpKey], tuple[pulp.LpVariable, float]] = field(default_factory=dict)
    """Per candidate overlapped pair ``(F key, backward key)``: its binary and its time."""
    """For two allocations on different streams of a device: 1 when the first started first."""
    hints: list[tuple[pulp.LpVariable, Hint]] = field(default_factory=list)
    lp: pulp.LpProblem | None = None
    """The model the variables belong to (PuLP 3 creates them through it)."""
    _count: int = 0

    def binary(self, prefix: str, hint: Hint) -> pulp.LpVariable:
        return self._new(prefix, 0, 1, pulp.LpBinary, hint)

    def continuous(self, prefix: str, low: float, high: float, hint: Hint) -> pulp.LpVariable:
        return self._new(prefix, low, high, pulp.LpContinuous, hint)

    def _new(self, prefix: str, low: float, high: float, cat: str, hint: Hint) -> pulp.LpVariable:
        self._count += 1
        name = f"{prefix}_{self._count}"
        if self.lp is not None and hasattr(self.lp, "add_variable"):
            var = self.lp.add_variable(name, low, high, cat=cat)
        else:  # PuLP before 3.3
            var = pulp.LpVariable(name, low, high, cat=cat)
        self.hints.append((var, hint))
        return var

    def before(self, u: OpKey, w: OpKey) -> Expr:
        """1 when ``u`` precedes ``w`` on their resource (a constant when the order is forced)."""
        if (u, w) in self.order:
            return self.order[u, w]
        return 1 - self.order[w, u]


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
    """``reach[u]``: ops that start only after ``u`` ends, in every schedule of the model."""
    infeasible: bool = False
    """Set when a constraint without variables fails (a cap below what precedences force)."""


def create_variables(model: MilpModel) -> None:
    """Every variable of the model: activation choices first, then op starts."""
    _activation_variables(model)
    _op_variables(model)
    _pair_variables(model)


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
    """A start variable per op, with its duration and presence as expressions."""
    problem, v = model.problem, model.vars
    for key, data in model.dag.nodes(data=True):
        duration, presence, max_duration = _duration_and_presence(model, key, data["duration"])
        v.ops[key] = OpVars(
            key=key,
            device=data["device"],
            resource=resource_of(problem, data["device"], data["stream"]),
            start=v.continuous("s", 0.0, model.horizon, hint_start(key)),
            duration=duration,
            max_duration=max_duration,
            presence=presence,
            optional=bool(data["optional"]),
        )


def _pair_variables(model: MilpModel) -> None:
    """A binary per candidate pair (:mod:`pp_opt.solvers.pairing`); in the pair, each half
    lasts the pair's time (so its successors wait for the pair's end, its free comes then)."""
    v = model.vars
    for f, b in candidates(model.problem, model.dag):
        x = v.binary("pair", hint_pair(f, b))
        size = pair_time(model.problem, f.stage, b.stage, b.kind)
        v.pairs[f, b] = (x, size)
        for half in (v.ops[f], v.ops[b]):
            base = half.max_duration if half.least is None else half.least
            half.least = base
            half.duration = half.duration + (size - base) * x
            half.max_duration = max(half.max_duration, size)


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


def evaluate(expr: Expr, values: dict[str, float]) -> float:
    """Value of a linear expression given the variables' values by name."""
    if isinstance(expr, int | float):
        return float(expr)
    if isinstance(expr, pulp.LpVariable):
        return values[expr.name]
    return float(expr.constant + sum(c * values[v.name] for v, c in expr.items()))


def hint_start(key: OpKey) -> Hint:
    return lambda warm, _: warm.start[key]


def hint_order(u: OpKey, w: OpKey) -> Hint:
    """``u`` before ``w``: by start, then end (zero-length copies), then key."""

    def value(warm: WarmValues, _: dict[str, float]) -> float:
        return float((warm.start[u], warm.end[u], u) < (warm.start[w], warm.end[w], w))

    return value


def hint_started_by(e: OpKey, a: OpKey) -> Hint:
    """``e`` has started when ``a`` starts (ties: by key, so exactly one of a pair counts)."""

    def value(warm: WarmValues, _: dict[str, float]) -> float:
        return float((warm.start[e], e) <= (warm.start[a], a))

    return value


def hint_ended_by(e: OpKey, a: OpKey) -> Hint:
    return lambda warm, _: float(warm.end[e] <= warm.start[a] + 1e-9)


def hint_offload(stage: int, microbatch: int, fraction: float) -> Hint:
    def value(warm: WarmValues, _: dict[str, float]) -> float:
        got = warm.fraction.get((stage, microbatch))
        return float(got is not None and abs(got - fraction) <= 1e-9)

    return value


def hint_pair(f: OpKey, b: OpKey) -> Hint:
    return lambda warm, _: float((f, b) in warm.pairs)


def hint_recompute(stage: int, microbatch: int) -> Hint:
    return lambda warm, _: float((stage, microbatch) in warm.recomputed)


def hint_product(a: Expr, b: Expr) -> Hint:
    return lambda _, values: evaluate(a, values) * evaluate(b, values)
