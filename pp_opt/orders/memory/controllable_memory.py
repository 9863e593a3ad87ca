"""V-Half and V-Min: V-shape schedules built from building blocks whose lifespans set the memory.

Qi et al., "Pipeline Parallelism with Controllable Memory" (NeurIPS 2024). On the
``v`` placement (device ``d`` holds stage ``d``, chunk 0, and stage ``2p - 1 - d``,
chunk 1) one microbatch's six ops per device (``F0 F1 B1 B0 W1 W0``) form a
*building block*: each op sits at a slot of a unit grid (every op one slot) and
the block repeats every 6 slots, one microbatch per period. The peak activation
memory of a device is about the total lifespan of its activations in the block
(from ``F`` to its ``B``/``W``) divided by the period, so the slot offsets control
memory:

- V-Min (``step = 1``): forwards go down and come back up one slot per device,
  backwards the same. Lifespans add up to about ``4p`` slots: a third of 1F1B's
  activation memory.
- V-Half (``step = 2``): forwards and backwards go down two slots per device and
  come back up one. Lifespans add up to about ``6p`` slots: half of 1F1B's.

Per device ``d`` the block's slots are ``F0 = step*d``, ``F1 = F0(p-1) + p - d``,
``B1 = F1(0) + 1 + gap + step*d`` and ``B0 = B1(p-1) + 1 + extra + (p-1-d)``;
``gap`` and ``extra`` move the backward wave so that no two ops of a device share
a slot modulo 6 (the paper's intervals). ``W`` ops take the free slots, each after
its ``B`` (oldest first, or chunk 1 first).

From a block to an order:

1. repeat it ``m`` times, one period apart (the unit-grid schedule);
2. *squeeze* (the paper's step): in slot order, move each op to the earliest free
   slot after its predecessors where the device's real memory (``m_b`` at ``F``,
   ``m_b - m_w`` freed at ``B``, ``m_w`` at ``W``) stays within the cap; this fills
   the warm-up and cool-down gaps of the repeated grid;
3. order each device's ops by slot and improve the order with real costs
   (:func:`pp_opt.orders.search.order_search.improve_order`: blocking ops, mostly ``W``,
   move behind the critical path).

:func:`v_half` and :func:`v_min` search the block parameters (``gap``, ``extra``,
``W`` placement, squeeze or not) for the problem's cap and return the best order
whose peak fits it. Why the result is valid: the order has every op once, its
grid respects every dependency (so it does not deadlock), and every step checks
the device's peak against the cap, which on one compute stream depends on the
order alone (:mod:`pp_opt.orders.search.fast_eval`); the caller's simulator and
validator re-check it all.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any

from pp_opt.errors import DeadlockError, InfeasibleError
from pp_opt.ops import OpKey, OpKind
from pp_opt.order import Order
from pp_opt.orders.search.fast_eval import CompiledProblem
from pp_opt.orders.search.order_search import improve_order
from pp_opt.orders.search.pieces import budget, compute_pieces
from pp_opt.problem import Problem
from pp_opt.problem_io import resplit

log = logging.getLogger(__name__)

F, B, W = OpKind.F, OpKind.B, OpKind.W
PERIOD = 6
"""Slots per microbatch and device: ``F0 F1 B1 B0 W1 W0``."""
FAMILIES = {"v-min": 1, "v-half": 2}
"""Generator name -> the ``step`` of its building block."""


@dataclass(frozen=True, slots=True)
class VBlock:
    """A V-shape building block: the unit-grid slots of one microbatch's ops."""

    step: int
    """Slots between neighbouring devices on the way down (1: V-Min, 2: V-Half)."""
    gap: int = 0
    """Extra slots between the last ``F1`` and the first ``B1``."""
    extra: int = 0
    """Extra slots between the last ``B1`` and the first ``B0``."""
    w_chunk1_first: bool = False
    """Free slots take chunk 1's pending ``W`` first (else the oldest ``B``'s ``W``)."""

    def slots(self, p: int) -> list[tuple[int, int, int, int]]:
        """Per device, the slots of ``F0, F1, B1, B0`` of microbatch 0."""
        f1_top = self.step * (p - 1) + p  # F1 on device 0
        b1_first = f1_top + 1 + self.gap  # B1 on device 0
        b0_first = b1_first + self.step * (p - 1) + 1 + self.extra  # B0 on device p - 1
        return [
            (self.step * d, f1_top - d, b1_first + self.step * d, b0_first + (p - 1 - d))
            for d in range(p)
        ]

    def is_valid(self, p: int) -> bool:
        """No two ops of a device share a slot modulo the period."""
        return all(len({s % PERIOD for s in row}) == 4 for row in self.slots(p))


def v_problem(problem: Problem) -> Problem:
    """The problem on the ``v`` placement (two chunks per device), re-split if needed."""
    if problem.placement == "v" and problem.v == 2:
        return problem
    log.info("re-splitting into the v placement with two chunks per device")
    return resplit(problem, "v", 2)


def grid_slots(problem: Problem, block: VBlock) -> dict[OpKey, int]:
    """The repeated block on the unit grid: the slot of every op (``W`` in free slots)."""
    p, m = problem.p, problem.m
    slot: dict[OpKey, int] = {}
    for d, (f0, f1, b1, b0) in enumerate(block.slots(p)):
        low, high = d, 2 * p - 1 - d  # chunk 0 and chunk 1 stage of device d
        taken: dict[int, OpKey] = {}
        for j in range(m):
            base = PERIOD * j
            for key, s in ((OpKey(F, low, j), f0), (OpKey(F, high, j), f1),
                           (OpKey(B, high, j), b1), (OpKey(B, low, j), b0)):  # fmt: skip
                taken[base + s] = key
                slot[key] = base + s
        _fill_w(taken, slot, high, block.w_chunk1_first)
    return slot


def _fill_w(taken: dict[int, OpKey], slot: dict[OpKey, int], high: int, chunk1_first: bool
            ) -> None:  # fmt: skip
    """Give each ``B``'s ``W`` a free slot after it, in the order the block prefers."""
    pending: list[OpKey] = []
    t, last = 0, max(taken)
    while t <= last or pending:
        key = taken.get(t)
        if key is not None:
            if key.kind is B:
                pending.append(key)
        elif pending:
            pick = 0
            if chunk1_first:
                pick = next((i for i, k in enumerate(pending) if k.stage == high), 0)
            b = pending.pop(pick)
            slot[OpKey(W, b.stage, b.microbatch)] = t
        t += 1


def squeeze(cp: CompiledProblem, slot: dict[OpKey, int], *, steady: bool = True,
            warm_up: bool = True, memory: bool = True) -> dict[OpKey, int]:  # fmt: skip
    """Move each op, in slot order, to the earliest free slot after its predecessors where
    its device stays within the cap (see the module doc, step 2).

    With ``steady`` false the steady phase stays as the block lays it out: only ops
    before the first microbatch's last backward ``B(0, 0)`` (warm-up) or after the
    last microbatch's first forward ``F(0, m - 1)`` (cool-down) move; with
    ``warm_up`` false the warm-up stays too. ``memory`` false skips the cap check
    (for a grid without its ``W`` ops, whose frees it could not place); the caller
    then checks the peak of the final order.
    """
    problem = cp.problem
    warm_end = slot[OpKey(B, 0, 0)]
    cool_start = slot[OpKey(F, 0, problem.m - 1)]
    length = max(slot.values()) + 2
    occupied: list[dict[int, OpKey]] = [{} for _ in range(problem.p)]
    for key, s in slot.items():
        occupied[problem.device_of(key.stage)][s] = key
    levels = [_slot_levels(cp, occupied[d], length) for d in range(problem.p)]
    rooms = [dev.cap - dev.static + 1e-9 for dev in problem.devices]
    new = dict(slot)
    for key in sorted(slot, key=slot.__getitem__):
        d, s = problem.device_of(key.stage), new[key]
        if (not steady and warm_end <= slot[key] <= cool_start) or (
            not warm_up and slot[key] < warm_end
        ):
            continue
        if not memory and key.kind is F:
            continue  # without the cap check, only frees may move earlier
        earliest = max((new[u] + 1 for u, _ in cp.preds[key]), default=0)
        if key.microbatch > 0:  # keep each stage's ops of one kind in microbatch order
            earliest = max(earliest, new[OpKey(key.kind, key.stage, key.microbatch - 1)] + 1)
        alloc, free, level = cp.alloc[key], cp.free[key], levels[d]
        if alloc > 0:  # slots t < s where the allocation fits from t to s form a suffix
            limit, lowest = rooms[d] - alloc, s
            while lowest > earliest and level[lowest - 1] <= limit:
                lowest -= 1
            earliest = lowest
        t = next((t for t in range(earliest, s) if t not in occupied[d]), None)
        if t is None:
            continue
        del occupied[d][s]
        occupied[d][t] = key
        new[key] = t
        for i in range(t, s):  # its allocation now happens earlier ...
            level[i] += alloc
        for i in range(t + 1, s + 1):  # ... and so does its free
            level[i] -= free
    return new


def _slot_levels(cp: CompiledProblem, occupied: dict[int, OpKey], length: int) -> list[float]:
    """Activation memory during each slot (after the slot's allocation, before its free)."""
    levels, level = [0.0] * length, 0.0
    for t in range(length):
        key = occupied.get(t)
        if key is None:
            levels[t] = level
        else:
            levels[t] = level + cp.alloc[key]
            level = levels[t] - cp.free[key]
    return levels


def order_of_slots(problem: Problem, slot: dict[OpKey, int]) -> list[list[OpKey]]:
    per_device: list[list[OpKey]] = [[] for _ in range(problem.p)]
    for key in sorted(slot, key=slot.__getitem__):
        per_device[problem.device_of(key.stage)].append(key)
    return per_device


def refill_w(problem: Problem, slot: dict[OpKey, int], block: VBlock) -> dict[OpKey, int]:
    """The grid with every ``W`` taken out and put back into the free slots after its ``B``."""
    new = {key: s for key, s in slot.items() if key.kind is not W}
    taken: list[dict[int, OpKey]] = [{} for _ in range(problem.p)]
    for key, s in new.items():
        taken[problem.stages[key.stage].device][s] = key
    for d in range(problem.p):
        _fill_w(taken[d], new, 2 * problem.p - 1 - d, block.w_chunk1_first)
    return new


def block_order(cp: CompiledProblem, block: VBlock, *, squeezed: str = "all",
                refill: bool = False) -> list[list[OpKey]]:  # fmt: skip
    """The per-device order of one building block (steps 1 and 2 of the module doc).

    ``squeezed`` says which ops the squeeze may move: ``all``, only the warm-up and
    cool-down (``ends``) or ``none``. ``refill`` adds a second squeeze of the cool-down
    without the ``W`` ops (so the backward wave drains first), then puts every ``W``
    back into the free slots.
    """
    slot = grid_slots(cp.problem, block)
    if squeezed != "none":
        slot = squeeze(cp, slot, steady=squeezed == "all")
    if refill:
        without_w = {key: s for key, s in slot.items() if key.kind is not W}
        slot = refill_w(cp.problem, squeeze(cp, without_w, steady=False, warm_up=False,
                                            memory=False), block)  # fmt: skip
    return order_of_slots(cp.problem, slot)


def candidate_blocks(family: str, p: int) -> list[VBlock]:
    """The valid blocks :func:`search_v` tries for a family on ``p`` devices, the paper's
    intervals first (V-Min: 2 when ``p`` is a multiple of 3; V-Half: 3 and one more
    slot before ``B0`` when ``p`` is even)."""
    step = FAMILIES[family]
    if step == 1:
        default = VBlock(step=1, gap=2 if p % 3 == 0 else 0)
    else:
        default = VBlock(step=2, gap=3 if p % 2 == 0 else 0, extra=1)
    blocks = [VBlock(step=step, gap=g, extra=e) for g in range(PERIOD) for e in (0, 1)]
    blocks.sort(key=lambda b: b != default)
    return [b for b in blocks if b.is_valid(p)]


LAYOUTS = (("ends", True), ("all", True), ("ends", False), ("all", False), ("none", True),
           ("none", False))  # fmt: skip
"""``(squeezed, refill)`` pairs in the order they are tried (the usual best first)."""


def search_v(problem: Problem, family: str, *, time_limit: float = 10.0, keep: int = 6
             ) -> Order:  # fmt: skip
    """The best order of a family's blocks under the problem's caps.

    Every valid block is laid out with each squeeze and timed; the ``keep`` fastest
    that fit the caps get their ``W`` ops moved off the critical path (quick), and the
    best of those is improved with every kind of move for the rest of ``time_limit``.

    Raises
    ------
    InfeasibleError
        When no setting fits the caps; ``min_cap`` is the smallest peak seen.
    """
    started = time.perf_counter()
    problem = v_problem(problem)
    cp = CompiledProblem.of(problem, split_backward=True)
    found, smallest_peak = _layouts(cp, family, started + time_limit / 2)
    if not found:
        device = min(range(problem.p), key=lambda d: problem.devices[d].cap)
        raise InfeasibleError(device=device, need=smallest_peak, cap=problem.devices[device].cap,
                              min_cap=smallest_peak, schedule=family)  # fmt: skip
    found.sort(key=lambda item: item[0])
    shortlist = found[:keep]
    quick = time_limit / 4 / len(shortlist)
    polished = []
    for _, order, settings in shortlist:
        order = improve_order(cp, order, time_limit=quick, only_w=True)
        polished.append((cp.makespan(order), order, settings))
    value, order, settings = min(polished, key=lambda item: item[0])
    left = time_limit - (time.perf_counter() - started)
    order = improve_order(cp, order, time_limit=max(0.0, left))
    log.info("%s: %s -> makespan %.6g", family, settings, cp.makespan(order))
    return compute_pieces(problem, order, family, settings)


def _layouts(cp: CompiledProblem, family: str, deadline: float = float("inf")
             ) -> tuple[list[tuple[float, list[list[OpKey]], dict[str, Any]]], float]:  # fmt: skip
    """``(makespan, order, settings)`` of the layouts that fit the caps, and the smallest
    peak of any layout (to say which cap would do when none fits). After ``deadline``
    it stops at the first layout that fits."""
    found: list[tuple[float, list[list[OpKey]], dict[str, Any]]] = []
    smallest_peak = float("inf")
    for block, (squeezed, refill) in itertools.product(
        candidate_blocks(family, cp.problem.p), LAYOUTS
    ):
        if found and time.perf_counter() > deadline:
            break
        try:
            order = block_order(cp, block, squeezed=squeezed, refill=refill)
            value = cp.makespan(order)
        except DeadlockError:
            continue
        smallest_peak = min(smallest_peak, max(cp.peaks(order)))
        if cp.fits(order):
            settings = dict(step=block.step, gap=block.gap, extra=block.extra,
                            squeezed=squeezed, refill=refill)  # fmt: skip
            found.append((value, order, settings))
    return found, smallest_peak


def v_half(problem: Problem, *, deadline: float | None = None, time_limit: float = 10.0) -> Order:
    """V-Half (about half of 1F1B's activation memory), best setting for the problem's cap.

    It searches for ``time_limit`` seconds, or half of what is left before ``deadline``.
    """
    return search_v(problem, "v-half", time_limit=budget(deadline, time_limit))


def v_min(problem: Problem, *, deadline: float | None = None, time_limit: float = 10.0) -> Order:
    """V-Min (about a third of 1F1B's activation memory), best setting for the problem's cap.

    It searches for ``time_limit`` seconds, or half of what is left before ``deadline``.
    """
    return search_v(problem, "v-min", time_limit=budget(deadline, time_limit))
