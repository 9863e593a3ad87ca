"""PipeOffload: interleaved 1F1B in groups, with the lower chunks' activations offloaded.

Wan et al., "PipeOffload: Improving Scalability of Pipeline Parallelism with
Memory Optimization" (ICML 2025). On the ``loop`` placement with ``v`` chunks per
device (stage ``c*p + d`` on device ``d``), the activation of a low chunk lives
from its forward, early in a microbatch's pass, to its backward, late in it; those
are the ones worth sending to the host. The schedule has two parts:

- **Compute order**: interleaved 1F1B with *interleave groups* of ``g``
  microbatches. Forwards go group by group, within a group chunk by chunk
  (``F`` of chunk 0 for the group's ``g`` microbatches, then chunk 1, ...);
  backwards in the same groups with the chunks reversed, each ``B`` followed by its
  ``W``. Device ``d`` runs ``warmup(d) = (v - 1) g + slope (p - 1 - d) + extra``
  forwards first, then alternates one forward with one ``B``/``W`` pair, then drains.
  A smaller ``g`` keeps fewer activations alive at once (the paper's memory knob);
  ``g >= p`` fills the pipeline.
- **Offloads**: which chunks may be offloaded (``chunks_offloaded`` lowest ones,
  the paper's offloaded-chunk choice) and where the copies go, for any host-link
  grouping: :func:`pp_opt.orders.offload.offload_links.place_offloads`, which moves only
  what the cap needs, oldest-needed last, one copy per link and direction.

:func:`pipeoffload` searches ``g``, the warm-up shape, the offloaded chunks and the
copy policy for the problem's cap and returns the fastest order the validator
accepts. Why the compute order cannot deadlock: on every device forwards and
backwards each keep one global order (microbatch groups, then chunks), the one
Megatron-LM's interleaved 1F1B uses; the copies keep it deadlock-free as
:mod:`pp_opt.orders.offload.offload_links` explains.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from pp_opt.errors import DeadlockError, NoOrderError, ProblemError
from pp_opt.ops import OpKey, OpKind
from pp_opt.order import Order
from pp_opt.orders.common import with_placement
from pp_opt.orders.offload.offload_links import OffloadPolicy, place_offloads
from pp_opt.orders.search.fast_eval import CompiledProblem
from pp_opt.orders.search.order_search import improve_order
from pp_opt.orders.search.pieces import budget, compute_pieces
from pp_opt.problem import Device, Problem

log = logging.getLogger(__name__)

F, B, W = OpKind.F, OpKind.B, OpKind.W


@dataclass(frozen=True, slots=True)
class GroupShape:
    """The parameters of a group-interleaved 1F1B compute order."""

    group: int
    """Microbatches per interleave group."""
    slope: int = 2
    """Extra warm-up forwards per device below the last one."""
    extra: int = 0
    """Warm-up forwards added on every device."""


def groups_of(m: int, group: int) -> list[range]:
    """Consecutive microbatch groups of ``group`` (the last one may be smaller)."""
    return [range(j, min(j + group, m)) for j in range(0, m, group)]


def group_interleaved_order(problem: Problem, shape: GroupShape) -> list[list[OpKey]]:
    """Per-device compute order of group-interleaved 1F1B (see the module doc)."""
    p, m, v = problem.p, problem.m, problem.v
    if problem.placement != "loop":
        raise ProblemError("placement", "pipeoffload needs the loop placement; re-split first")
    split = problem.split_backward
    back = B if split else OpKind.BW
    per_device = []
    for d in range(p):
        forwards, backwards = [], []
        for batch in groups_of(m, shape.group):
            forwards += [OpKey(F, c * p + d, j) for c in range(v) for j in batch]
            backwards += [OpKey(back, c * p + d, j) for c in reversed(range(v)) for j in batch]
        total = len(forwards)
        warmup = (v - 1) * min(shape.group, m) + shape.slope * (p - 1 - d) + shape.extra
        warmup = max(1, min(warmup, total))
        ops = forwards[:warmup]
        for k in range(warmup, total + warmup):
            if k < total:
                ops.append(forwards[k])
            b = backwards[k - warmup]
            ops.append(b)
            if split:
                ops.append(OpKey(W, b.stage, b.microbatch))
        per_device.append(ops)
    return per_device


def shapes(problem: Problem) -> Iterable[GroupShape]:
    """The compute orders :func:`pipeoffload` tries: group sizes from ``ceil(p / 2)``
    (the paper's smallest useful one) to ``p``, never more than ``m``."""
    p, m = problem.p, problem.m
    for group in range(min((p + 1) // 2, m), min(p, m) + 1):
        for slope in (1, 2):
            for extra in (0, 1, 2):
                yield GroupShape(group=group, slope=slope, extra=extra)


def pipeoffload(problem: Problem, *, deadline: float | None = None,
                time_limit: float = 30.0) -> Order:  # fmt: skip
    """PipeOffload's schedule for the problem's cap and host links, best setting found.

    Compute orders are timed without copies first; the fastest that fits the cap alone
    needs no copies (it is improved under the cap). Then, in three steps within
    ``time_limit``:

    1. quick: the fastest compute order of each group size gets copies with the first
       policy and the fewest offloaded chunks that work;
    2. polish: the best one's compute order is improved without the cap (whose memory
       the copies take care of) and given copies again;
    3. wide: every compute order faster than the best so far, with the other policies.

    A compute order no faster than the best schedule so far is skipped (copies and
    waits can only delay it). Every candidate is simulated and validated.

    Raises
    ------
    InfeasibleError
        When no setting gives a valid schedule under the cap.
    """
    started = time.perf_counter()
    time_limit = budget(deadline, time_limit)
    problem = with_placement(problem, "pipeoffload", "loop", problem.v)
    cp = CompiledProblem.of(problem, split_backward=problem.split_backward)
    timed = _timed_orders(problem, cp)
    fitting = next((item for item in timed if cp.fits(item[2])), None)
    best: _Best | None = None
    if fitting is not None:  # no copies needed: improve it under the cap itself
        value, shape, order = fitting
        order = improve_order(cp, order, time_limit=0.3 * time_limit)
        settings = {**_settings(shape, 0, None), "polished": True}
        pieces = compute_pieces(
            problem, order, "pipeoffload", settings, split_backward=problem.split_backward
        )
        best = _Best(cp.makespan(order), shape, order, 0, None, pieces)
    if problem.offload:
        search = _Search(problem, cp, started + time_limit, best)
        seen_groups: set[int] = set()
        for value, shape, order in timed:
            if shape.group not in seen_groups:
                seen_groups.add(shape.group)
                if search.worth(value):
                    search.try_order(shape, order, quick=True)
        if search.best is not None and search.best.policy is not None:
            search.polish(started + 0.6 * time_limit)
        for value, shape, order in timed:
            if search.worth(value):
                search.try_order(shape, order, quick=False)
        best = search.best
    if best is None:
        raise NoOrderError(
            "pipeoffload", "no setting gives a valid schedule under the cap; raise the cap, "
            "allow offload (offload = true) or give the host links more time",
        )  # fmt: skip
    log.info("pipeoffload: %s -> makespan %.6g", best.pieces.settings, best.makespan)
    return best.pieces


def _timed_orders(problem: Problem, cp: CompiledProblem
                  ) -> list[tuple[float, GroupShape, list[list[OpKey]]]]:  # fmt: skip
    """Every compute order that runs, with its makespan, fastest (then leanest) first."""
    timed = []
    for shape in shapes(problem):
        order = group_interleaved_order(problem, shape)
        try:
            timed.append((cp.makespan(order), max(cp.peaks(order)), shape, order))
        except DeadlockError:
            continue
    timed.sort(key=lambda item: item[:2])
    return [(value, shape, order) for value, _, shape, order in timed]


@dataclass(slots=True)
class _Best:
    makespan: float
    shape: GroupShape
    order: list[list[OpKey]]
    chunks: int
    policy: OffloadPolicy | None
    pieces: Order


class _Search:
    """The best valid schedule over compute orders, offloaded chunks and copy policies."""

    def __init__(self, problem: Problem, cp: CompiledProblem, deadline: float,
                 best: _Best | None) -> None:  # fmt: skip
        self.problem, self.cp, self.deadline, self.best = problem, cp, deadline, best

    def worth(self, compute_makespan: float) -> bool:
        """Whether a compute order this fast can still beat the best, and time is left."""
        if time.perf_counter() > self.deadline:
            return False
        return self.best is None or compute_makespan < self.best.makespan - 1e-9

    def try_order(self, shape: GroupShape, order: list[list[OpKey]], *, quick: bool) -> None:
        """Quick: the first policy, chunks growing until one works. Else the other
        policies, with those chunks and one more."""
        first = None
        for chunks in range(1, self.problem.v + 1):
            if time.perf_counter() > self.deadline:
                return
            if self._try(shape, order, chunks, _policies(self.problem, chunks)[0]):
                first = chunks
                break
        if quick or first is None:
            return
        for chunks in range(first, min(first + 1, self.problem.v) + 1):
            for policy in _policies(self.problem, chunks)[1:]:
                if time.perf_counter() > self.deadline:
                    return
                self._try(shape, order, chunks, policy)

    def polish(self, deadline: float) -> None:
        """Improve the best compute order without the cap, then place its copies again."""
        best = self.best
        left = deadline - time.perf_counter()
        if best is None or best.policy is None or left <= 0:
            return
        roomy = self.problem.replace(devices=tuple(Device(cap=1e300, static=d.static)
                                                   for d in self.problem.devices))  # fmt: skip
        cp = CompiledProblem.of(roomy, split_backward=self.problem.split_backward)
        order = improve_order(cp, best.order, time_limit=left * 0.8)
        improved = self._try(best.shape, order, best.chunks, best.policy)
        if improved and self.best is not None and self.best is not best:
            settings = {**self.best.pieces.settings, "polished": True}
            self.best.pieces = replace(self.best.pieces, settings=settings)

    def _try(self, shape: GroupShape, order: list[list[OpKey]], chunks: int,
             policy: OffloadPolicy) -> bool:  # fmt: skip
        """Place copies; keep the result if it is valid and the best so far. True if valid."""
        from pp_opt.validator import validate

        placed = place_offloads(self.problem, order, policy=policy, compiled=self.cp)
        if placed is None or validate(placed[1]):
            return False
        pieces, schedule = placed
        if self.best is None or schedule.metrics.makespan < self.best.makespan - 1e-9:
            settings = _settings(shape, chunks, policy)
            self.best = _Best(schedule.metrics.makespan, shape, order, chunks, policy,
                              replace(pieces, name="pipeoffload", settings=settings))  # fmt: skip
        return True


def _policies(problem: Problem, chunks: int) -> list[OffloadPolicy]:
    p = problem.p

    def low(stage: int) -> bool:
        return stage < chunks * p

    return [
        OffloadPolicy(lead=lead, eager=eager, eligible=low, fixed_times=True)
        for eager in (True, False)
        for lead in (0.0, 1.0)
    ]


def _settings(shape: GroupShape, chunks: int, policy: OffloadPolicy | None) -> dict[str, Any]:
    out: dict[str, Any] = {"group": shape.group, "slope": shape.slope, "extra": shape.extra,
                 "chunks_offloaded": chunks}  # fmt: skip
    if policy is not None:
        out.update(lead=policy.lead, eager=policy.eager, fraction=policy.fraction)
    return out
