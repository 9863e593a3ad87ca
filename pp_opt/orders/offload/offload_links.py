"""Offload placement under shared host links: add OFFLOAD/RELOAD to any compute order.

Given a compute order (1F1B, ZB-V, V-Half, a schedule made for a larger cap, ...)
and a problem whose cap it exceeds, this pass chooses which activations go to the
host and when, and returns an order with copies and cross-stream waits. Devices in
one ``host_links`` group share one copy resource per direction; the simulator
serves it one copy at a time, earliest ready first, and the validator checks it.

How it decides (per device, walking its compute order with the memory level):

1. Times are estimated by timing the compute order alone (later rounds use the
   times of the previous round's simulated schedule).
2. Allocations are events: a forward allocates when it starts, a reload when it
   starts. When an event would take the device over its cap, activations resident
   at that point (forward done, backward later, not offloaded yet) are offloaded,
   the one whose backward is furthest in the future first (Belady's rule, optimal
   for paging with equal sizes), skipping those whose reload would not fit before
   their backward. The fraction is 1, or with ``fraction="need"`` just what covers
   the excess; a window too short for a whole copy gets the part that fits.
3. Each offload must end before the event it makes room for: the wait
   ``(OFFLOAD, event op)``. Its reload starts after the latest compute op that
   leaves ``lead`` reload times before the backward: the wait ``(that op, RELOAD)``,
   and the reload is itself an allocation event at that point of the walk.

Why the result is valid:

- Memory: the walk counts every offload's free at the latest instant the waits
  allow (just before its event) and every reload's allocation at the earliest (just
  after its anchor op), so the real level is never above the walked level, which is
  within the cap at every event.
- No deadlock: an event op waits only on offloads of activations whose forward comes
  before it; the d2h stream runs offloads in forward order and the h2d stream reloads
  in backward order, each reload anchored before its own backward; a shared link is
  released when a copy ends, so it never holds a device forever.
- Link: the simulator never runs two copies of one group and direction at once;
  :func:`pp_opt.validator.validate` checks it (rule ``link_overlap``).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from pp_opt.dag import dag_for
from pp_opt.errors import DeadlockError
from pp_opt.ops import BACKWARD_KINDS, OpKey, OpKind, Stream, duration
from pp_opt.order import Order, Variant
from pp_opt.orders.search.fast_eval import CompiledProblem
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule
from pp_opt.simulator import simulate

log = logging.getLogger(__name__)

Activation = tuple[int, int]
"""``(stage, microbatch)`` of one activation."""

_TOL = 1e-9


@dataclass(frozen=True, slots=True)
class OffloadPolicy:
    """How :func:`place_offloads` chooses copies."""

    lead: float = 1.0
    """Reloads aim to end this many reload durations before their backward starts
    (room for waiting on a shared link); 0 means just in time."""
    fraction: str = "whole"
    """``whole``: move whole activations; ``need``: move only what covers the excess."""
    fractions: tuple[float, ...] | None = None
    """The fractions a copy may move (e.g. a solver's discrete choices); any when None.
    A wanted fraction is rounded up to one of them where the window allows, else down."""
    eligible: Callable[[int], bool] | None = None
    """Which stages may be offloaded (all when None)."""
    eager: bool = False
    """Offload every eligible activation right after its forward (PipeOffload's way),
    not only when the cap is reached; the link then works ahead of the need."""
    rounds: int = 2
    """Plan, simulate, re-plan with the simulated times: this many times at most."""
    fixed_times: bool = False
    """Re-plan with the compute order's own times (only the link deadlines change)."""


@dataclass(slots=True)
class _Plan:
    """The copies chosen for one device: fraction, the op its offload must end before,
    and the compute op its reload starts after."""

    fraction: dict[Activation, float] = field(default_factory=dict)
    before: dict[Activation, OpKey] = field(default_factory=dict)
    after: dict[Activation, OpKey] = field(default_factory=dict)


class _DeviceWalk:
    """The memory walk of one device (steps 2 and 3 of the module doc)."""

    def __init__(self, cp: CompiledProblem, ops: Sequence[OpKey], start: dict[OpKey, float],
                 end: dict[OpKey, float], policy: OffloadPolicy, room: float,
                 reload_by: dict[Activation, float]) -> None:  # fmt: skip
        self.cp, self.ops, self.start, self.end = cp, ops, start, end
        self.reload_by = reload_by
        self.policy, self.exact_room = policy, room
        self.room = room + _TOL * max(1.0, room)  # for checks only, never to size a copy
        self.position = {key: i for i, key in enumerate(ops)}
        self.forward_at: dict[Activation, int] = {}
        self.backward_at: dict[Activation, int] = {}
        for i, key in enumerate(ops):
            if key.kind is OpKind.F:
                self.forward_at[(key.stage, key.microbatch)] = i
            elif key.kind in BACKWARD_KINDS:
                self.backward_at[(key.stage, key.microbatch)] = i
        self.plan = _Plan()
        self.level = 0.0
        self.reloads_after: dict[int, list[Activation]] = {}
        self.unclaimed: list[Activation] = []  # eager offloads no event has waited for yet

    def run(self) -> _Plan | None:
        for q, key in enumerate(self.ops):
            alloc = self.cp.alloc[key]
            if alloc > 0 and not self._make_room(alloc, q, key, strict=False):
                return None
            self.level += alloc - self.cp.free[key]
            if self.policy.eager and key.kind is OpKind.F:
                self._offload_now((key.stage, key.microbatch), q)
            for act in sorted(self.reloads_after.pop(q, []), key=self.backward_at.__getitem__):
                need = self.plan.fraction[act] * self._m_b(act)
                if act in self.unclaimed:  # its free was never counted: the reload cancels it
                    self.unclaimed.remove(act)
                    continue
                reload = OpKey(OpKind.RELOAD, *act)
                if not self._make_room(need, q, reload, strict=True):
                    return None
                self.level += need
        return self.plan

    def _offload_now(self, act: Activation, q: int) -> None:
        """Plan an eager offload; its free counts only once an event waits for it."""
        eligible = self.policy.eligible
        if act not in self.backward_at or (eligible is not None and not eligible(act[0])):
            return
        if self._fraction(act, q, float("inf"), strict=True) < 1.0:
            return  # the window is too short for a whole copy
        anchor = self._reload_anchor(act, q, 1.0, strict=True)
        if anchor is None:
            return
        self.plan.fraction[act] = 1.0
        self.plan.after[act] = self.ops[anchor]
        self.reloads_after.setdefault(anchor, []).append(act)
        self.unclaimed.append(act)

    def _m_b(self, act: Activation) -> float:
        return self.cp.problem.stages[act[0]].m_b

    def _make_room(self, need: float, q: int, event: OpKey, strict: bool) -> bool:
        """Offload resident activations until ``need`` fits at position ``q``; their
        offloads must end before ``event``. Eager offloads planned already are claimed
        first (oldest first), then new victims are chosen."""
        while self.unclaimed and self.level + need > self.room:
            act = self.unclaimed.pop(0)
            self.plan.before[act] = event
            self.level -= self._m_b(act)
        for act in self._victims(q, strict):
            if self.level + need <= self.room:
                break
            fraction = self._fraction(act, q, self.level + need - self.exact_room, strict)
            if fraction <= 0:
                continue
            anchor = self._reload_anchor(act, q, fraction, strict)
            if anchor is None:
                continue
            self.plan.fraction[act] = fraction
            self.plan.before[act] = event
            self.plan.after[act] = self.ops[anchor]
            self.reloads_after.setdefault(anchor, []).append(act)
            self.level -= fraction * self._m_b(act)
        return self.level + need <= self.room

    def _victims(self, q: int, strict: bool) -> list[Activation]:
        """Resident activations at ``q``, furthest backward first."""
        eligible = self.policy.eligible
        found = [
            act
            for act, f in self.forward_at.items()
            if (f < q or (strict and f == q))
            and self.backward_at.get(act, -1) > q
            and act not in self.plan.fraction
            and (eligible is None or eligible(act[0]))
        ]
        found.sort(key=lambda act: -self.start[self.ops[self.backward_at[act]]])
        return found

    def _fraction(self, act: Activation, q: int, excess: float, strict: bool) -> float:
        """Whole, or what covers ``excess``; never more than the window can copy: the
        offload from the forward's end to the backward's start, and the reload, ``lead``
        included, from the end of op ``q`` (or the next, for a reload event) to it."""
        stage = self.cp.problem.stages[act[0]]
        wanted = 1.0 if self.policy.fraction == "whole" else min(1.0, excess / stage.m_b)
        reload_time = stage.t_reload * (1.0 + self.policy.lead)
        backward = self.start[self.ops[self.backward_at[act]]]
        window = backward - self.end[self.ops[self.forward_at[act]]]
        after = self.end[self.ops[min(q + 1 if strict else q, len(self.ops) - 1)]]
        limits = [wanted]
        if stage.t_offload + reload_time > 0:
            limits.append(window / (stage.t_offload + reload_time))
        if reload_time > 0:
            limits.append((backward - after) / reload_time)
        fraction = max(0.0, min(limits))
        allowed = self.policy.fractions
        if allowed is None or fraction <= 0:
            return fraction
        up = [a for a in allowed if fraction - _TOL <= a <= min(limits[1:], default=1.0) + _TOL]
        down = [a for a in allowed if a <= fraction + _TOL]
        return min(up) if up else max(down, default=0.0)

    def _reload_anchor(self, act: Activation, q: int, fraction: float, strict: bool) -> int | None:
        """The last compute op after ``q`` (at ``q`` for a forward event) that leaves the
        reload ``lead`` durations to spare before its backward; None when none does."""
        stage = self.cp.problem.stages[act[0]]
        lead = fraction * stage.t_reload * (1.0 + self.policy.lead)
        b = self.backward_at[act]
        deadline = min(self.start[self.ops[b]] - lead, self.reload_by.get(act, float("inf")))
        first = q + 1 if strict else q
        anchor = None
        for r in range(b - 1, first - 1, -1):
            if self.end[self.ops[r]] <= deadline + _TOL:
                anchor = r
                break
        return anchor


def plan_offloads(
    cp: CompiledProblem,
    per_device: Sequence[Sequence[OpKey]],
    start: dict[OpKey, float],
    end: dict[OpKey, float],
    policy: OffloadPolicy,
    reload_by: dict[Activation, float] | None = None,
) -> Order | None:
    """One round: the copies and waits for estimated compute times (None if some event
    cannot get room). ``reload_by`` gives reloads a latest start (:func:`link_deadlines`)."""
    problem = cp.problem
    streams: dict[tuple[int, Stream], list[OpKey]] = {}
    fractions: dict[OpKey, float] = {}
    waits: list[tuple[OpKey, OpKey]] = []
    for d, ops in enumerate(per_device):
        device = problem.devices[d]
        room = device.cap - device.static
        plan = _DeviceWalk(cp, ops, start, end, policy, room, reload_by or {}).run()
        if plan is None:
            return None
        streams[(d, Stream.COMPUTE)] = list(ops)
        walk_pos = {key: i for i, key in enumerate(ops)}
        offloads = sorted(plan.fraction, key=lambda a: walk_pos[OpKey(OpKind.F, *a)])
        reloads = sorted(plan.fraction, key=lambda a: _backward_position(walk_pos, a))
        streams[(d, Stream.D2H)] = [OpKey(OpKind.OFFLOAD, *a) for a in offloads]
        streams[(d, Stream.H2D)] = [OpKey(OpKind.RELOAD, *a) for a in reloads]
        for act, fraction in plan.fraction.items():
            off, rel = OpKey(OpKind.OFFLOAD, *act), OpKey(OpKind.RELOAD, *act)
            if fraction < 1.0:
                fractions[off] = fractions[rel] = fraction
            if act in plan.before:  # an eager offload no event needed has no wait
                waits.append((off, plan.before[act]))
            waits.append((plan.after[act], rel))
    split = not any(key.kind is OpKind.BW for ops in per_device for key in ops)
    return Order(problem=problem, streams=streams, fractions=fractions, waits=tuple(waits),
                 variant=Variant(split_backward=split, offload=True, recompute=False),
                 name="offload-links",
                 settings={"lead": policy.lead, "fraction": policy.fraction})  # fmt: skip


def split_of(per_device: Sequence[Sequence[OpKey]]) -> bool:
    """Whether an order splits the backward (no fused ``BW`` op in it)."""
    return not any(key.kind is OpKind.BW for ops in per_device for key in ops)


def link_deadlines(pieces: Order, backward_start: dict[OpKey, float]
                   ) -> dict[Activation, float]:  # fmt: skip
    """Latest start of each reload of ``pieces`` so that the reloads sharing a link (or a
    device's own h2d stream) all end by the given backward starts: taken from the last
    backward back, each ends by its backward and before the next one on the link starts."""
    problem = pieces.problem
    by_link: dict[tuple[str, int], list[tuple[float, float, Activation]]] = {}
    for (device, stream), keys in pieces.streams.items():
        if stream is not Stream.H2D:
            continue
        group = problem.link_group(device)
        link = ("group", group) if group is not None else ("device", device)
        for key in keys:
            act = (key.stage, key.microbatch)
            b_start = next(backward_start[OpKey(kind, *act)] for kind in BACKWARD_KINDS
                           if OpKey(kind, *act) in backward_start)  # fmt: skip
            length = duration(problem, OpKind.RELOAD, key.stage, pieces.fractions.get(key, 1.0))
            by_link.setdefault(link, []).append((b_start, length, act))
    latest: dict[Activation, float] = {}
    for items in by_link.values():
        free_until = float("inf")
        for b_start, length, act in sorted(items, reverse=True):
            latest[act] = free_until = min(b_start, free_until) - length
    return latest


def _backward_position(position: dict[OpKey, int], act: Activation) -> int:
    for kind in BACKWARD_KINDS:
        at = position.get(OpKey(kind, *act))
        if at is not None:
            return at
    raise KeyError(act)


def place_offloads(
    problem: Problem,
    per_device: Sequence[Sequence[OpKey]],
    *,
    policy: OffloadPolicy | None = None,
    compiled: CompiledProblem | None = None,
) -> tuple[Order, Schedule] | None:
    """Copies that bring a compute order under the caps, re-planned over a few rounds.

    Parameters
    ----------
    problem
        The problem with its caps and host links; it must allow offload.
    per_device
        One compute-stream op list per device (any valid order).
    policy
        How to choose copies (:class:`OffloadPolicy`).
    compiled
        ``CompiledProblem.of(problem)`` when the caller has it already.

    Returns
    -------
    tuple[Order, Schedule] or None
        The pieces and their simulated schedule with the smallest objective over the
        rounds whose memory walk succeeded (the caller validates it), or None.
    """
    policy = policy or OffloadPolicy()
    split = split_of(per_device)
    cp = compiled or CompiledProblem.of(problem, split_backward=split)
    dag = dag_for(problem, Variant(split_backward=split, offload=True, recompute=False))
    try:
        end = cp.ends(per_device)
    except DeadlockError:
        return None
    start = {key: e - cp.duration[key] for key, e in end.items()}
    target = dict(start)  # the backward starts the copies should not delay
    best: tuple[Order, Schedule] | None = None
    reload_by: dict[Activation, float] = {}
    for _ in range(policy.rounds):
        pieces = plan_offloads(cp, per_device, start, end, policy, reload_by)
        if pieces is None:
            break
        try:
            schedule = simulate(pieces, dag=dag)
        except DeadlockError as err:  # not expected (see the module doc); keep going safely
            log.warning("offload plan deadlocks: %s", err)
            break
        if best is None or schedule.objective_value() < best[1].objective_value() - _TOL:
            best = (pieces, schedule)
        if not policy.fixed_times:
            start = {op.key: op.start for op in schedule.ops}
            end = {op.key: op.end for op in schedule.ops}
        reload_by = link_deadlines(pieces, target)
    return best


def _first_chunk(problem: Problem, stage: int) -> bool:
    """Whether ``stage`` is the lowest stage of its device."""
    return stage == min(problem.stages_on(problem.device_of(stage)))


def with_link_offloads(
    problem: Problem, schedule: Schedule, fractions: Sequence[float] = (1.0,)
) -> Schedule | None:
    """A schedule's compute order under ``problem``'s caps and host links, with copies.

    The drop-in for :func:`pp_opt.orders.offload.offload_warm.with_offloads` that also
    serves shared host links: the compute order is the one ``schedule`` ran (e.g.
    made without the cap), copies come from :func:`place_offloads` with a few
    policies, and the fastest schedule the validator accepts is returned; None when
    the problem does not allow offload or no policy gives a valid schedule.
    """
    from pp_opt.validator import validate

    if not problem.offload:
        return None
    order = [[op.key for op in schedule.stream_order(d, Stream.COMPUTE)] for d in range(problem.p)]
    allowed = tuple(sorted(set(fractions)))
    modes = ("whole",) if allowed == (1.0,) else ("whole", "need")
    compiled = CompiledProblem.of(problem, split_backward=split_of(order))
    # Beyond ``loop`` (one chunk after the other on every device), the first chunk of a
    # device lives longest: also try offloading only first chunks.
    eligible: list[Callable[[int], bool] | None] = [None]
    if problem.placement != "loop":
        eligible.append(partial(_first_chunk, problem))
    best: Schedule | None = None
    for eager, lead, mode, only in itertools.product((False, True), (0.0, 0.5, 1.0), modes,
                                                     eligible):  # fmt: skip
        if (only is not None and eager) or (only is None and lead == 0.5):
            continue
        policy = OffloadPolicy(lead=lead, fraction=mode, eager=eager, fractions=allowed,
                               eligible=only)  # fmt: skip
        placed = place_offloads(problem, order, policy=policy, compiled=compiled)
        if placed is None or validate(placed[1]):
            continue
        if best is None or placed[1].objective_value() < best.objective_value():
            best = placed[1]
    return best
