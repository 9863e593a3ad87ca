"""Improve a compute order by moving ops off its critical path, keeping it under the caps.

A rule pattern is laid out on a unit grid; with real costs (``W`` shorter than
``F``, link latency) some of its ops stand in the way of the critical chain. This
pass walks the critical path of the timed order backwards; wherever an op starts
only because the op before it on its device has just ended, it tries to run that
blocking op later (one to a few places), and keeps the move when the makespan
drops. Each accepted move is one step of a descent, so the result is never worse
than the input.

Why every order it keeps is valid:

- Dependencies: the timer below gives earliest starts that respect every DAG edge
  and latency; a move that would make a device wait on itself is a deadlock, which
  the timer detects (some op never gets a time), and the move is undone.
- Memory: only the moved op's own effect changes place. Running an op later moves
  its allocation later (the level in between only drops) or its free later (the
  level in between rises by that free); the second is checked against the cap.

:class:`IncrementalTimer` re-times only the ops a move can change, so one try
costs about the length of the part that moves rather than a full timing.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Sequence

from pp_opt.ops import OpKey, OpKind
from pp_opt.orders.search.fast_eval import CompiledProblem

log = logging.getLogger(__name__)

_TOL = 1e-9


class IncrementalTimer:
    """Earliest-start times of a per-device order, kept up to date under single moves."""

    def __init__(self, cp: CompiledProblem, per_device: Sequence[Sequence[OpKey]]) -> None:
        self.cp = cp
        self.orders = [list(ops) for ops in per_device]
        self.end = cp.ends(self.orders)
        self.where = {key: (d, i) for d, ops in enumerate(self.orders) for i, key in enumerate(ops)}

    def makespan(self) -> float:
        return max(self.end.values())

    def start(self, key: OpKey) -> float:
        return self.end[key] - self.cp.duration[key]

    def move(self, device: int, old: int, new: int) -> dict[OpKey, float] | None:
        """Move the op at ``old`` to index ``new`` (``new > old``) on ``device`` and re-time.

        Returns the previous ends of the ops that changed (for :meth:`undo`), or None
        when the move deadlocks (then nothing has changed).
        """
        ops = self.orders[device]
        key = ops.pop(old)
        ops.insert(new, key)
        for i in range(old, new + 1):
            self.where[ops[i]] = (device, i)
        changed: dict[OpKey, float] = {}
        heap = [(self.start(k), i, k) for i, k in enumerate(ops[old : new + 1], start=old)]
        heapq.heapify(heap)
        budget = 4 * len(self.end)
        while heap:
            budget -= 1
            if budget < 0:  # a cycle keeps pushing times up: the move deadlocks
                self.undo(changed)
                self._put_back(device, new, old)
                return None
            _, _, k = heapq.heappop(heap)
            d, i = self.where[k]
            start = self.end[self.orders[d][i - 1]] if i > 0 else 0.0
            for u, latency in self.cp.preds[k]:
                start = max(start, self.end[u] + latency)
            finish = start + self.cp.duration[k]
            if abs(finish - self.end[k]) <= _TOL:
                continue
            changed.setdefault(k, self.end[k])
            self.end[k] = finish
            nxt = [w for w, _ in self.cp.succs[k]]
            if i + 1 < len(self.orders[d]):
                nxt.append(self.orders[d][i + 1])
            for w in nxt:
                heapq.heappush(heap, (start, id(w), w))
        return changed

    def undo(self, changed: dict[OpKey, float]) -> None:
        self.end.update(changed)

    def revert(self, device: int, old: int, new: int, changed: dict[OpKey, float]) -> None:
        """Undo a successful :meth:`move` (its order change and its times)."""
        self.undo(changed)
        self._put_back(device, new, old)

    def _put_back(self, device: int, at: int, to: int) -> None:
        ops = self.orders[device]
        key = ops.pop(at)
        ops.insert(to, key)
        for i in range(min(at, to), max(at, to) + 1):
            self.where[ops[i]] = (device, i)


def critical_blocks(timer: IncrementalTimer) -> list[tuple[int, int]]:
    """``(device, index)`` of each op on the critical path that starts right when the op
    before it on its device ends (the device order, not a dependency, holds it back)."""
    cp, end = timer.cp, timer.end
    key = max(end, key=lambda k: end[k])
    found: list[tuple[int, int]] = []
    while True:
        device, index = timer.where[key]
        start = end[key] - cp.duration[key]
        if start <= _TOL:
            return found
        before = timer.orders[device][index - 1] if index > 0 else None
        if before is not None and abs(end[before] - start) <= _TOL:
            found.append((device, index))
            key = before
            continue
        binding = [u for u, lat in cp.preds[key] if abs(end[u] + lat - start) <= _TOL]
        if not binding:
            return found
        key = binding[0]


def _fits_later(cp: CompiledProblem, ops: list[OpKey], old: int, new: int, room: float) -> bool:
    """Whether ``ops[old]`` may run after ``ops[old + 1 .. new]``: none of them needs it
    directly, and the device stays within ``room``."""
    moved = ops[old]
    if any(u == moved for k in ops[old + 1 : new + 1] for u, _ in cp.preds[k]):
        return False  # an op it moves past depends on it: that order would deadlock
    moved_free = cp.free[moved]
    if moved_free <= 0:
        return True
    level = 0.0
    for i in range(new + 1):
        k = ops[i]
        if i == old:
            level += cp.alloc[k] - cp.free[k]
            continue
        during = level + cp.alloc[k] + (moved_free if old < i <= new else 0.0)
        if old < i <= new and during > room + _TOL * max(1.0, room):
            return False
        level += cp.alloc[k] - cp.free[k]
    return True


def improve_order(
    cp: CompiledProblem,
    per_device: Sequence[Sequence[OpKey]],
    *,
    shifts: Sequence[int] = (1, 2, 3),
    time_limit: float = 10.0,
    max_moves: int = 10_000,
    only_w: bool = False,
) -> list[list[OpKey]]:
    """Descent on the makespan: defer ops that block the critical path (see the module doc).

    Parameters
    ----------
    cp
        The compiled problem; the caps are ``cp.problem``'s.
    per_device
        A valid starting order (it must fit the caps; it is returned unchanged otherwise).
    shifts
        How many places a blocking op may move later in one step.
    time_limit
        Seconds after which the descent stops with the best order so far.
    max_moves
        Accepted moves at most.
    only_w
        Move only ``W`` ops (nothing waits for them, so a move changes little: fast).
    """
    if not cp.fits(per_device):
        return [list(ops) for ops in per_device]
    deadline = time.perf_counter() + time_limit
    timer = IncrementalTimer(cp, per_device)
    rooms = [d.cap - d.static for d in cp.problem.devices]
    best = timer.makespan()
    moves = tries = 0
    while moves < max_moves and time.perf_counter() < deadline:
        accepted = False
        for device, index in critical_blocks(timer):
            if time.perf_counter() > deadline:
                break
            ops = timer.orders[device]
            if only_w and ops[index - 1].kind is not OpKind.W:
                continue
            for shift in shifts:
                old, new = index - 1, index - 1 + shift
                if new >= len(ops) or not _fits_later(cp, ops, old, new, rooms[device]):
                    continue
                tries += 1
                changed = timer.move(device, old, new)
                if changed is None:
                    continue
                value = timer.makespan()
                if value < best - _TOL:
                    best, accepted = value, True
                    break
                timer.revert(device, old, new, changed)
            if accepted:
                break
        if not accepted:
            break
        moves += 1
    log.debug("improve_order: %d moves of %d tried, makespan %.6g", moves, tries, best)
    return timer.orders
