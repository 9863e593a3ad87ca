"""Ops that trade slots keep orders some optimum keeps (:mod:`pp_opt.solvers.cpsat.exchange`).

- Which rules hold, by hand: the loss stage's backward before its next forward when
  both last as long; at the turn of a ``v`` placement, the later stage's forward before
  the earlier stage's next one, and the earlier stage's backward before the later one's
  next; none with offload or recompute, none where durations or ``W`` differ.
- The swaps undo broken rules and keep a schedule valid, as fast and under its peak memory
  on every device: the rule schedules keep the rules already, so each is first broken on
  purpose (later ``Y`` moved before ``X(i)``), then swapped back.
- The rules lose no optimum: CP-SAT proves the same optima with them and without them
  on small tight instances (``v``, ``loop`` and an explicit zigzag, split and fused).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from families import exact_family

from pp_opt import baseline, validate
from pp_opt.dag import dag_for
from pp_opt.errors import PPOptError
from pp_opt.ops import OpKey, OpKind, Stream
from pp_opt.schedule import Schedule
from pp_opt.simulator import order_of, simulate
from pp_opt.solvers.base import SolveOptions
from pp_opt.solvers.cpsat import constraints, solve_cpsat
from pp_opt.solvers.cpsat.exchange import (
    ExchangeRule,
    exchange_pairs,
    exchange_rules,
    in_exchange_order,
)
from pp_opt.solvers.cpsat.w_order import in_w_order, w_class

F, B, W, BW = OpKind.F, OpKind.B, OpKind.W, OpKind.BW


def test_the_rules_of_a_v_placement() -> None:
    assert exchange_rules(exact_family(4, 8, 2.5), split=True) == [
        ExchangeRule((B, 7), (F, 7)),  # loss stage
        ExchangeRule((F, 4), (F, 3)),  # the turn's forwards
        ExchangeRule((B, 3), (B, 4)),  # the turn's backwards
    ]
    pairs = exchange_pairs(
        exact_family(2, 3, 2.5), dag_for(exact_family(2, 3, 2.5)).nodes, split=True
    )
    assert pairs == [
        (OpKey(B, 3, 0), OpKey(F, 3, 1)), (OpKey(B, 3, 1), OpKey(F, 3, 2)),
        (OpKey(F, 2, 0), OpKey(F, 1, 1)), (OpKey(F, 2, 1), OpKey(F, 1, 2)),
        (OpKey(B, 1, 0), OpKey(B, 2, 1)), (OpKey(B, 1, 1), OpKey(B, 2, 2)),
    ]  # fmt: skip


def test_only_ops_that_last_as_long_and_move_memory_the_right_way_trade() -> None:
    # A loop placement has no turn; the loss stage trades.
    assert exchange_rules(exact_family(4, 8, 2.5, "loop"), split=True) == [
        ExchangeRule((B, 7), (F, 7))
    ]
    # A backward twice as long as the forward: no loss rule, the turn keeps both.
    assert exchange_rules(exact_family(4, 8, 2.5, t_b=2.0), split=True) == [
        ExchangeRule((F, 4), (F, 3)), ExchangeRule((B, 3), (B, 4))
    ]  # fmt: skip
    # Fused backward (1.6) against a forward of 1.0: the turn trades its fused backwards.
    assert exchange_rules(exact_family(4, 8, 2.5), split=False) == [
        ExchangeRule((F, 4), (F, 3)), ExchangeRule((BW, 3), (BW, 4))
    ]  # fmt: skip
    # Two stages whose W differ: their backwards do not trade.
    problem = exact_family(4, 8, 2.5)
    stages = list(problem.stages)
    stages[4] = replace(stages[4], t_w=0.7)
    assert exchange_rules(problem.replace(stages=tuple(stages)), split=True) == [
        ExchangeRule((B, 7), (F, 7)), ExchangeRule((F, 4), (F, 3))
    ]  # fmt: skip
    # The later stage of the turn allocates more: its forward may not move earlier.
    stages = list(problem.stages)
    stages[4] = replace(stages[4], m_b=1.5)
    rules = exchange_rules(problem.replace(stages=tuple(stages)), split=True)
    assert ExchangeRule((F, 4), (F, 3)) not in rules
    assert exchange_rules(problem.replace(recompute=True), split=True) == []


def test_a_sequence_worked_by_hand() -> None:
    # F(1, k) ahead of F(2, i) for k > i: F(2, 0) takes the first one's place, each of them
    # the next one's (ops of other stages stay); then F(2, 1) trades with F(1, 2).
    seq = [OpKey(F, 1, 0), OpKey(F, 1, 1), OpKey(F, 1, 2), OpKey(B, 0, 5), OpKey(F, 2, 0),
           OpKey(F, 2, 1), OpKey(F, 2, 2)]  # fmt: skip
    rules = [ExchangeRule((F, 2), (F, 1))]
    assert in_exchange_order(seq, rules) == [
        OpKey(F, 1, 0), OpKey(F, 2, 0), OpKey(F, 1, 1), OpKey(B, 0, 5), OpKey(F, 2, 1),
        OpKey(F, 1, 2), OpKey(F, 2, 2),
    ]  # fmt: skip


def _breaking(schedule: Schedule) -> Schedule:
    """``schedule`` with ``Y(i + 1)`` and ``Y(i + 2)`` (or, where that makes a wait across
    devices circular, ``Y(i + 1)`` alone) moved right before ``X(i)`` for every third ``i``
    of every rule: an order the rules forbid."""
    problem = schedule.problem
    order = order_of(schedule)
    for rule in exchange_rules(problem, split=schedule.variant.split_backward):
        for i in range(0, problem.m - 2, 3):
            x, y = rule.pair(i)
            for ys in ([y, rule.pair(i + 1)[1]], [y]):
                streams = dict(order.streams)
                for key, keys in streams.items():
                    if x in keys and all(k in keys and keys.index(k) > keys.index(x) for k in ys):
                        moved = [k for k in keys if k not in ys]
                        at = moved.index(x)
                        streams[key] = moved[:at] + ys + moved[at:]
                try:
                    simulate(replace(order, streams=streams))
                except PPOptError:  # a wait across devices the move makes circular
                    continue
                order = replace(order, streams=streams)
                break
    return simulate(order)


def _broken_pairs(schedule: Schedule) -> list[tuple[OpKey, OpKey]]:
    at = {op.key: (op.start, op.end) for op in schedule.ops}
    pairs = exchange_pairs(schedule.problem, at, split=schedule.variant.split_backward)
    return [(a, b) for a, b in pairs if at[a][1] > at[b][0] + 1e-9]


FUSED_AS_LONG = {"t_b": 0.6, "t_w": 0.4}
"""Costs whose fused backward lasts as long as the forward, so the loss stage trades."""


@pytest.mark.parametrize(
    "rule,placement,costs",
    [("v-half", "v", {}), ("v-min", "v", {}), ("zb-v", "v", {}), ("zb-h1", "loop", {}),
     ("1f1b", "loop", FUSED_AS_LONG), ("interleaved-1f1b", "loop", FUSED_AS_LONG)],
)  # fmt: skip
def test_the_swaps_keep_a_schedule_valid_and_as_fast(
    rule: str, placement: str, costs: dict[str, float]
) -> None:
    # The rule schedules keep the rules already: break them first, then swap back.
    problem = exact_family(4, 8, 20.0, placement, **costs)
    broken = _breaking(baseline(rule, problem))
    assert validate(broken) == [] and _broken_pairs(broken)
    order = order_of(broken)
    problem = broken.problem  # the rule's own (1F1B and ZB-H1 run one chunk per device)
    rules = exchange_rules(problem, split=broken.variant.split_backward)
    streams = {
        key: in_w_order(in_exchange_order(keys, rules), w_class(problem))
        if key[1] is Stream.COMPUTE
        else keys
        for key, keys in order.streams.items()
    }
    swapped = simulate(replace(order, streams=streams))
    assert validate(swapped) == []
    assert _broken_pairs(swapped) == []
    assert swapped.objective_value("makespan") <= broken.objective_value("makespan") + 1e-9
    for now, before in zip(swapped.metrics.peak_memory, broken.metrics.peak_memory, strict=True):
        assert now <= before + 1e-9


@pytest.mark.parametrize(
    "p,m,cap,placement,split",
    [(2, 4, 1.5, "v", True), (3, 4, 2.0, "v", True), (3, 5, 2.5, "v", True),
     (2, 5, 1.2, "loop", True), (2, 4, 2.0, "v", False), (2, 4, 1.5, "0,1,1,0,0,1", True)],
)  # fmt: skip
def test_the_rules_lose_no_optimum(
    p: int, m: int, cap: float, placement: str, split: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Fused: a backward as long as the forward, so the loss stage trades.
    costs = {} if split else {"t_b": 0.6, "t_w": 0.4, "split_backward": False}
    if "," in placement:  # explicit devices: a zigzag of two turns, the loss stage beside one
        devices = [int(d) for d in placement.split(",")]
        loop = exact_family(p, m, cap, "loop", v=len(devices) // p, **costs)
        stages = tuple(replace(st, device=d) for st, d in zip(loop.stages, devices, strict=True))
        problem = loop.replace(stages=stages, placement="explicit")
    else:
        problem = exact_family(p, m, cap, placement, **costs)
    assert exchange_pairs(problem, dag_for(problem).nodes, split=split)
    found = {}
    for rules in ("with", "without"):
        if rules == "without":
            monkeypatch.setattr(constraints, "exchange_pairs", lambda *a, **k: [])
        options = SolveOptions(time_limit=30.0, threads=2)
        result = solve_cpsat(problem, dag_for(problem), options)
        assert result.status == "optimal", rules
        found[rules] = result.objective
    assert found["with"] == pytest.approx(found["without"], abs=1e-6)
