"""Ops of one device that can trade slots: orders some optimum keeps (loss stage, turns).

Take two compute ops of one device that last exactly as long, ``y`` running before ``x``.
Give ``x`` the slot of ``y`` and ``y`` the slot of ``x``: every moment at which the device
starts or ends an op stays the same, so the makespan and every device's span do too. It
keeps the schedule valid when ``x`` is ready by the earlier slot, whatever waits for ``y``
runs after the later one, and the memory is nowhere higher (``x`` moves its changes
earlier, ``y`` later: ``x``'s change at its start, at its end and in all is at most
``y``'s). Three such pairs recur in every pipeline without offload and recompute, each
between an op ``X(i)`` of microbatch ``i`` and the op ``Y(i + 1)`` (the *rule*: ``X(i)``
before ``Y(i + 1)``; the DAG already runs ``X(i - 1)`` ... ``Y(i)`` ... ``X(i)`` in that
order on one device, latency 0):

- the loss stage ``S - 1``: its backward ``B(S-1, i)`` before its next forward
  ``F(S-1, i + 1)``, when both last as long (a backward only frees, a forward only
  allocates, so the swap moves a free earlier and an allocation later);
- a *turn*, stages ``s`` and ``s + 1`` on one device (the V of a ``v`` placement):
  ``F(s + 1, i)`` before ``F(s, i + 1)`` when they last as long and ``F(s + 1)`` allocates
  at most what ``F(s)`` does; ``B(s, i)`` before ``B(s + 1, i + 1)`` when they last as long,
  ``B(s)`` frees at least what ``B(s + 1)`` does, and their ``W`` are alike (or the backward
  is fused).

Why the swap is valid, for the turn's forwards (the others alike): let ``i`` be the first
microbatch with some ``F(s, k)``, ``k > i``, before ``F(s + 1, i)``, and ``F(s, k)`` the last
such. ``F(s + 1, i)`` needs ``F(s, i)`` (before ``F(s, k)``) and ``F(s + 1, i - 1)`` (before
``F(s, i)``, as ``i`` is the first), so it is ready by ``F(s, k)``'s slot; what waits for
``F(s, k)`` is ``F(s + 1, k)`` and ``B(s, k)``, both after ``F(s + 1, i)`` (microbatch
order), and ``F(s, k + 1)``, after it as ``k`` is the last. Each swap removes one inverted
pair and keeps the microbatch order of :func:`~.constraints.symmetry_chains`, so repeating
it ends in a schedule that keeps every rule, as fast. A turn's backward swap may leave a
``W`` of ``B(s + 1, k)`` before its new slot: the backwards of one class of alike ``W`` end
at the same moments as before, so giving the ``W`` slots out in the backwards' order
(:mod:`.w_order`, applied last) makes it valid again. The loss stage and the turns share no
op (a turn next to the loss stage or next to another turn is left out), so their swaps do
not undo each other.

At p 4, m 12, cap 2.5 of ``bench_solvers.py --parts exact`` (``scripts/makespan_question.py``,
2 cores) the three rules order 33 pairs, and the proof that no schedule has makespan <= 38.00
took 43.5 / 30.2 s instead of 84 / 56 s (seeds 0 / 1); <= 38.25: 72.3 / 88.1 s instead of
157 s (seed 0), all in hundredths; with the coarser exact unit of :mod:`.scaling` (0.05),
40.5 / 27.4 s and 67.3 / 81.3 s.
"""

from __future__ import annotations

import math
from collections.abc import Container, Sequence
from dataclasses import dataclass

from pp_opt.ops import OpKey, OpKind, duration, memory_delta
from pp_opt.problem import Problem
from pp_opt.runtime_rules import loss_stage
from pp_opt.solvers.cpsat.w_order import w_class

__all__ = ["ExchangeRule", "exchange_pairs", "exchange_rules", "in_exchange_order"]


@dataclass(frozen=True, slots=True)
class ExchangeRule:
    """``first`` of microbatch ``i`` before ``then`` of microbatch ``i + 1`` (``(kind, stage)``)."""

    first: tuple[OpKind, int]
    then: tuple[OpKind, int]

    def pair(self, i: int) -> tuple[OpKey, OpKey]:
        return OpKey(self.first[0], self.first[1], i), OpKey(self.then[0], self.then[1], i + 1)


def exchange_rules(problem: Problem, *, split: bool) -> list[ExchangeRule]:
    """The rules (module docstring) that hold for ``problem``'s DAG, split or fused backward;
    none with offload or recompute (their memory moves at other moments)."""
    if problem.offload or problem.recompute:
        return []
    backward = OpKind.B if split else OpKind.BW
    device = [st.device for st in problem.stages]
    last = loss_stage(problem)
    w_of = w_class(problem)
    rules = []
    if _trade(problem, (backward, last), (OpKind.F, last)):
        rules.append(ExchangeRule((backward, last), (OpKind.F, last)))
    for s in range(last - 1):
        neighbours = [t for t in (s - 1, s + 2) if 0 <= t <= last]
        if device[s] != device[s + 1] or any(device[t] == device[s] for t in neighbours):
            continue
        if _trade(problem, (OpKind.F, s + 1), (OpKind.F, s)):
            rules.append(ExchangeRule((OpKind.F, s + 1), (OpKind.F, s)))
        alike = not split or w_of(OpKey(OpKind.W, s, 0)) == w_of(OpKey(OpKind.W, s + 1, 0))
        if alike and _trade(problem, (backward, s), (backward, s + 1)):
            rules.append(ExchangeRule((backward, s), (backward, s + 1)))
    return rules


def _trade(problem: Problem, x: tuple[OpKind, int], y: tuple[OpKind, int]) -> bool:
    """Whether ``x`` may take an earlier slot of ``y`` and ``y`` its later one: as long,
    and no memory change of ``x`` above ``y``'s (at the start, at the end, in all)."""
    if duration(problem, *x) != duration(problem, *y):
        return False
    x_start, x_end = memory_delta(problem, *x)
    y_start, y_end = memory_delta(problem, *y)
    return _le(x_start, y_start) and _le(x_end, y_end) and _le(x_start + x_end, y_start + y_end)


def _le(a: float, b: float) -> bool:
    return a <= b or math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


def exchange_pairs(
    problem: Problem, keys: Container[OpKey], *, split: bool
) -> list[tuple[OpKey, OpKey]]:
    """``(a, b)``: ``a`` ends before ``b`` starts, for every rule and microbatch, among ``keys``."""
    pairs = []
    for rule in exchange_rules(problem, split=split):
        for i in range(problem.m - 1):
            a, b = rule.pair(i)
            if a in keys and b in keys:
                pairs.append((a, b))
    return pairs


def in_exchange_order(sequence: Sequence[OpKey], rules: Sequence[ExchangeRule]) -> list[OpKey]:
    """One device's op sequence with the swaps of the module docstring made until every rule
    holds (for a warm start; alike ``W`` are given out in their backwards' order after it).

    For each microbatch ``i`` in turn, the swaps that bring ``X(i)`` before every later
    ``Y`` ahead of it, last one first, amount to a rotation: ``X(i)`` takes the first such
    ``Y``'s place and each of them the next one's.
    """
    out = list(sequence)
    for rule in rules:
        i = 0
        while True:
            x = next((n for n, k in enumerate(out) if k == OpKey(*rule.first, i)), None)
            if x is None:
                break
            ys = [n for n in range(x) if (out[n].kind, out[n].stage) == rule.then
                  and out[n].microbatch > i]  # fmt: skip
            if ys:
                places = [*ys, x]
                moved = [out[x]] + [out[n] for n in ys]
                for n, key in zip(places, moved, strict=True):
                    out[n] = key
            i += 1
    return out
