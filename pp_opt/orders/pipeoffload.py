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
  grouping: :func:`pp_opt.orders.offload_links.place_offloads`, which moves only
  what the cap needs, oldest-needed last, one copy per link and direction.

:func:`pipeoffload` searches ``g``, the warm-up shape, the offloaded chunks and the
copy policy for the problem's cap and returns the fastest order the validator
accepts. Why the compute order cannot deadlock: on every device forwards and
backwards each keep one global order (microbatch groups, then chunks), the one
Megatron-LM's interleaved 1F1B uses; the copies keep it deadlock-free as
:mod:`.offload_links` explains.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from pp_opt.errors import DeadlockError, InfeasibleError, ProblemError
from pp_opt.ops import OpKey, OpKind
from pp_opt.orders.fast_eval import CompiledProblem
from pp_opt.orders.offload_links import OffloadPolicy, place_offloads
from pp_opt.orders.order_search import improve_order
from pp_opt.orders.pieces import OrderPieces, compute_pieces
from pp_opt.problem import Problem

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
    """The compute orders :func:`pipeoffload` tries."""
    p = problem.p
    for group in range(max(1, (p + 1) // 2), min(p, problem.m) + 1):
        for slope in (1, 2):
            for extra in (0, 1, 2):
                yield GroupShape(group=group, slope=slope, extra=extra)


def pipeoffload(problem: Problem, *, time_limit: float = 30.0) -> OrderPieces:
    """PipeOffload's schedule for the problem's cap and host links, best setting found.

    Compute orders are timed without copies first. A compute order that fits the cap
    alone needs no copies. Otherwise, fastest first: a quick pass gives each order
    copies with one policy and the fewest offloaded chunks that work; a second pass
    tries the other policies and chunk counts. An order whose compute alone is no
    faster than the best schedule so far is skipped (copies and waits only delay
    it). Last, the best compute order is improved without the cap (whose memory the
    copies take care of) and given copies again. Every candidate is simulated and
    validated.

    Raises
    ------
    InfeasibleError
        When no setting gives a valid schedule under the cap.
    """
    started = time.perf_counter()
    deadline = started + time_limit
    cp = CompiledProblem.of(problem, split_backward=problem.split_backward)
    timed = []
    for shape in shapes(problem):
        order = group_interleaved_order(problem, shape)
        try:
            timed.append((cp.makespan(order), shape, order))
        except DeadlockError:
            continue
    timed.sort(key=lambda item: item[0])
    best: _Best | None = None
    for value, shape, order in timed:
        if cp.fits(order):
            settings = _settings(shape, 0, None)
            pieces = compute_pieces(problem, order, "pipeoffload", settings)
            best = _Best(value, shape, order, 0, None, pieces)
            break
    if problem.offload:
        search = _Search(problem, cp, started + 0.6 * time_limit, best)
        for quick in (True, False):
            for value, shape, order in timed:
                if search.best is not None and value >= search.best.makespan - 1e-9:
                    break  # sorted: no later compute order can win either
                search.try_order(shape, order, quick=quick)
        best = search.best
        if best is not None and best.policy is not None:
            best = _polish(problem, best, deadline) or best
    if best is None:
        raise InfeasibleError(
            "pipeoffload found no valid schedule under the cap; raise the cap, allow "
            "offload (offload = true) or give the host links more time",
        )
    log.info("pipeoffload: %s -> makespan %.6g", best.pieces.settings, best.makespan)
    return best.pieces


@dataclass(slots=True)
class _Best:
    makespan: float
    shape: GroupShape
    order: list[list[OpKey]]
    chunks: int
    policy: OffloadPolicy | None
    pieces: OrderPieces


class _Search:
    """The best valid schedule over compute orders, offloaded chunks and copy policies."""

    def __init__(self, problem: Problem, cp: CompiledProblem, deadline: float,
                 best: _Best | None) -> None:  # fmt: skip
        self.problem, self.cp, self.deadline, self.best = problem, cp, deadline, best

    def try_order(self, shape: GroupShape, order: list[list[OpKey]], *, quick: bool) -> None:
        """Quick: the first policy, chunks growing until one works; else every other pair."""
        for chunks in range(1, self.problem.v + 1):
            policies = _policies(self.problem, chunks)
            for policy in policies[:1] if quick else policies[1:]:
                if time.perf_counter() > self.deadline:
                    return
                if self._try(shape, order, chunks, policy) and quick:
                    return

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
                              pieces._replace(name="pipeoffload", settings=settings))  # fmt: skip
        return True


def _polish(problem: Problem, best: _Best, deadline: float) -> _Best | None:
    """Improve the best compute order without the cap, then place its copies again."""
    from pp_opt.problem import Device
    from pp_opt.validator import validate

    roomy = problem.replace(devices=tuple(Device(cap=1e300, static=d.static)
                                          for d in problem.devices))  # fmt: skip
    left = deadline - time.perf_counter()
    if left <= 0 or best.policy is None:
        return None
    cp = CompiledProblem.of(roomy, split_backward=problem.split_backward)
    order = improve_order(cp, best.order, time_limit=left * 0.7)
    placed = place_offloads(problem, order, policy=best.policy)
    if placed is None or placed[1].metrics.makespan >= best.makespan - 1e-9 or validate(placed[1]):
        return None
    settings = {**_settings(best.shape, best.chunks, best.policy), "polished": True}
    return _Best(placed[1].metrics.makespan, best.shape, order, best.chunks, best.policy,
                 placed[0]._replace(name="pipeoffload", settings=settings))  # fmt: skip


def _policies(problem: Problem, chunks: int) -> list[OffloadPolicy]:
    p = problem.p

    def low(stage: int) -> bool:
        return stage < chunks * p

    return [
        OffloadPolicy(lead=lead, eager=eager, eligible=low, fixed_times=True)
        for eager in (True, False)
        for lead in (0.0, 1.0)
    ]


def _settings(shape: GroupShape, chunks: int, policy: OffloadPolicy | None) -> dict:
    out: dict = {"group": shape.group, "slope": shape.slope, "extra": shape.extra,
                 "chunks_offloaded": chunks}  # fmt: skip
    if policy is not None:
        out.update(lead=policy.lead, eager=policy.eager, fraction=policy.fraction)
    return out
