"""Step 3 of a plan: layer splits worth scheduling, from a small CP-SAT model over the split.

A stage's costs are linear in its decoder layers (:class:`pp_opt.profiler.analytic.UnitCosts`):
``n_s x layer`` plus the embedding on the first stage and the output layer on the last. The
model chooses ``n_s >= 1`` with ``sum n_s = layers`` and minimises a makespan proxy ``T``,
the larger of the classic pipeline estimate and the device term of :func:`pp_opt.lower_bound`
written in the split::

    T >= m L_d + (p - 1) C                                   for every device d
    T >= fill(d) + m (F_d + B_d) + max(m W_d, drain(d))      for every device d

(``L_d``: the device's work per microbatch; ``C``: the largest stage's ``t_f + t_b + t_w``,
so ``(m + p - 1) C`` for one balanced chunk per device, as 1F1B, and a bubble that shrinks
with smaller chunks, as interleaving; ``fill``/``drain``: the forward and backward chains
before the device's first stage), subject to one memory row per device: static memory (its
stages' parameters times the bytes per parameter) plus ``k_s x m_b(s)`` over its stages, at
most the cap, where ``k_s`` is how many microbatches stage ``s`` keeps in flight. That count
depends on the schedule, so the model is solved at up to three levels: the in-flight counts
of the placement's classic schedule (:func:`in_flight`: 1F1B, interleaved 1F1B, the V
shape), half of them, and one microbatch per stage (the least any schedule needs; the solver
then trades bubble for memory, or recomputes or offloads). At the first level that fits the
second-best split is found too (a no-good cut), and the best at one microbatch is added when
its proxy is lower; the schedule solver decides between them.

Ties in ``T`` go to the split with the smaller lower-bound row (a shorter fill before its
busiest devices), then to fewer layers on stages with more microbatches in flight; one worker
and a fixed seed make the same inputs give the same splits.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pp_opt.job import Job
from pp_opt.placement import stage_devices
from pp_opt.profiler.analytic import UnitCosts
from pp_opt.profiler.layer_split import stage_total

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

log = logging.getLogger(__name__)

TIME_SCALE = 1000.0
"""Model time unit: microseconds (costs are in ms)."""
MEMORY_SCALE = 2.0**20
"""Model memory unit: MiB (costs are in bytes); memory coefficients are rounded up."""
SPLIT_WORK_LIMIT = 0.5
"""CP-SAT deterministic time (about seconds) one objective of a split model may take; most
prove optimality in milliseconds, and a deterministic limit keeps the answer reproducible."""


def in_flight(placement: str, p: int, v: int, m: int) -> list[int]:
    """Microbatches each stage keeps in flight at the peak of the placement's classic schedule.

    ``loop``, ``v = 1`` (1F1B): ``p - d`` on device ``d``. ``loop``, ``v > 1`` (interleaved
    1F1B, Megatron-LM): device ``d`` warms up ``2 (p - d - 1) + (v - 1) p`` chunks, so holds
    that plus one chunk activations, spread evenly over its chunks. ``v`` placement (the V
    shape): ``2 (p - d) - 1`` on the device's first chunk and ``2 d + 1`` on its second,
    ``2p`` chunk activations in all. Each count is at most ``m``.
    """
    devices = stage_devices(placement, p, v)
    out = []
    for s, d in enumerate(devices):
        if placement == "v":
            k = 2 * (p - d) - 1 if s < p else 2 * d + 1
        elif v == 1:
            k = p - d
        else:
            k = math.ceil((2 * (p - d - 1) + (v - 1) * p + 1) / v)
        out.append(max(1, min(m, k)))
    return out


@dataclass(kw_only=True, slots=True, frozen=True)
class SplitModel:
    """The split problem of one configuration, in integer units (µs, MiB)."""

    layers: int
    """Decoder layers to split."""
    devices: tuple[int, ...]
    """Device of each stage."""
    m: int
    """Microbatches."""
    layer: tuple[int, int, int, int, int]
    """One layer's ``t_f, t_b, t_w`` (µs), ``m_b`` (MiB) and static memory (MiB)."""
    first: tuple[int, int, int, int, int]
    """The same, added to the first stage (the embedding)."""
    last: tuple[int, int, int, int, int]
    """The same, added to the last stage (the output layer)."""
    t_comm: int
    """One cross-device hop (µs)."""
    room: int
    """Cap per device (MiB)."""
    k: tuple[int, ...]
    """Microbatches in flight per stage at the reference level."""
    reserved: tuple[int, ...] = ()
    """Per device, memory beside its layers' state and activations that no split moves (MiB,
    a correction where negative; empty: none): receive buffers, the output logits, a
    backward's transients, the allocator's cached buffers
    (:func:`pp_opt.planner.candidates.config_split_model`)."""

    def held(self, d: int) -> int:
        """Device ``d``'s :attr:`reserved` memory (MiB)."""
        return self.reserved[d] if self.reserved else 0

    @property
    def stages(self) -> int:
        return len(self.devices)

    @property
    def p(self) -> int:
        return max(self.devices) + 1

    def stage(self, s: int, n: int) -> list[int]:
        """``t_f, t_b, t_w, m_b, static`` of stage ``s`` with ``n`` layers."""
        return stage_total(n, self.layer, self.first, self.last, first=s == 0,
                           last=s == self.stages - 1)  # fmt: skip

    def proxy(self, split: Sequence[int]) -> int:
        """The makespan proxy ``T`` of ``split`` (µs), as the CP-SAT model computes it."""
        return self.score(split, self.k)[0]

    def score(self, split: Sequence[int], k: Sequence[int]) -> tuple[int, int, int]:
        """``(T, lower-bound row, tie)``: what :func:`best_split` minimises, in that order."""
        costs = [self.stage(s, n) for s, n in enumerate(split)]
        largest = max(c[0] + c[1] + c[2] for c in costs)
        classic = rows = 0
        for d in range(self.p):
            mine = [s for s in range(self.stages) if self.devices[s] == d]
            s0 = min(mine)
            hops = _hops(self.devices, s0)
            fill = sum(costs[s][0] for s in range(s0)) + hops * self.t_comm
            drain = 0
            if s0 > 0:
                drain = sum(costs[s][1] for s in range(s0)) + costs[0][2] + hops * self.t_comm
            fb = self.m * sum(costs[s][0] + costs[s][1] for s in mine)
            w = self.m * sum(costs[s][2] for s in mine)
            rows = max(rows, fill + fb + max(w, drain))
            classic = max(classic, fb + w + (self.p - 1) * largest)
        tie = sum(k[s] * n for s, n in enumerate(split))
        return max(classic, rows), rows, tie

    def memory(self, split: Sequence[int], k: Sequence[int]) -> list[int]:
        """Per device: static plus ``k_s x m_b(s)`` over its stages (MiB)."""
        need = [self.held(d) for d in range(self.p)]
        for s, n in enumerate(split):
            cost = self.stage(s, n)
            need[self.devices[s]] += cost[4] + k[s] * cost[3]
        return need

    def fits(self, split: Sequence[int], k: Sequence[int]) -> bool:
        return max(self.memory(split, k)) <= self.room


def _hops(devices: Sequence[int], stage: int) -> int:
    return sum(1 for s in range(stage) if devices[s] != devices[s + 1])


def _units(costs: dict[str, float], bytes_per_param: float, expert_bytes: float,
           activation_scale: float = 1.0) -> tuple[int, int, int, int, int]:  # fmt: skip
    experts = costs.get("expert_params", 0.0)
    static = (costs["params"] - experts) * bytes_per_param + experts * expert_bytes
    return (
        round(costs["t_f"] * TIME_SCALE),
        round(costs["t_b"] * TIME_SCALE),
        round(costs["t_w"] * TIME_SCALE),
        math.ceil(costs["m_b"] * activation_scale / MEMORY_SCALE),
        math.ceil(static / MEMORY_SCALE),
    )


def split_model(
    job: Job,
    units: UnitCosts,
    *,
    layers: int,
    bytes_per_param: float,
    cap: float,
    t_comm: float,
    expert_bytes_per_param: float | None = None,
    activation_scale: float = 1.0,
) -> SplitModel:
    """The split problem of ``job`` from the profiler's per-layer costs (routed experts'
    static bytes at ``expert_bytes_per_param``, default ``bytes_per_param``; activations
    times ``activation_scale``, the reserved bytes the allocator keeps per allocated one)."""
    experts = bytes_per_param if expert_bytes_per_param is None else expert_bytes_per_param
    scale = activation_scale
    return SplitModel(
        layers=layers,
        devices=job.stage_devices,
        m=job.microbatches,
        layer=_units(units.layer, bytes_per_param, experts, scale),
        first=_units(units.embedding, bytes_per_param, experts, scale),
        last=_units(units.head, bytes_per_param, experts, scale),
        t_comm=round(t_comm * TIME_SCALE),
        room=math.floor(cap / MEMORY_SCALE),
        k=tuple(in_flight(job.placement, job.pp, job.v, job.microbatches)),
    )


def best_split(
    model: SplitModel, k: Sequence[int], exclude: Sequence[Sequence[int]] = ()
) -> tuple[int, ...] | None:
    """The best split whose memory at in-flight counts ``k`` fits, other than those in
    ``exclude``; None if none fits. Lexicographic: least proxy ``T``, then least lower-bound
    row (shorter fill before the busiest devices), then fewer layers where more is in flight.
    """
    from ortools.sat.python import cp_model

    if model.layers < model.stages:
        return None
    cp = cp_model.CpModel()
    n: list[Any] = [cp.new_int_var(1, model.layers, f"n{s}") for s in range(model.stages)]
    cp.add(sum(n) == model.layers)
    stage = [_stage_exprs(model, s, n[s]) for s in range(model.stages)]
    horizon = model.proxy([model.layers] * model.stages) + 1
    t = cp.new_int_var(0, horizon, "T")
    rows = cp.new_int_var(0, horizon, "rows")
    largest = cp.new_int_var(0, horizon, "C")
    for s in range(model.stages):
        cp.add(largest >= stage[s][0] + stage[s][1] + stage[s][2])
    for d in range(model.p):
        mine = [s for s in range(model.stages) if model.devices[s] == d]
        s0 = min(mine)
        hops = _hops(model.devices, s0) * model.t_comm
        fill = sum(stage[s][0] for s in range(s0)) + hops
        fb = model.m * sum(stage[s][0] + stage[s][1] for s in mine)
        w = model.m * sum(stage[s][2] for s in mine)
        cp.add(rows >= fill + fb + w)
        if s0 > 0:
            drain = sum(stage[s][1] for s in range(s0)) + stage[0][2] + hops
            cp.add(rows >= fill + fb + drain)
        cp.add(t >= fb + w + (model.p - 1) * largest)
        cp.add(sum(stage[s][4] + k[s] * stage[s][3] for s in mine) + model.held(d) <= model.room)
    cp.add(t >= rows)
    for other in exclude:
        differs = [cp.new_bool_var(f"x{s}") for s in range(model.stages)]
        for s, var in enumerate(differs):
            cp.add(n[s] != other[s]).only_enforce_if(var)
        cp.add_bool_or(differs)
    tie = sum(k[s] * n[s] for s in range(model.stages))
    found: tuple[int, ...] | None = None
    for objective in (t, rows, tie):
        cp.minimize(objective)
        solver = _solver()
        status = solver.solve(cp)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return found
        found = tuple(int(solver.value(x)) for x in n)
        cp.clear_hints()  # type: ignore[no-untyped-call]
        for var, value in zip(n, found, strict=True):
            cp.add_hint(var, value)
        cp.add(objective <= int(solver.objective_value))
    return found


def _solver() -> cp_model.CpSolver:
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_deterministic_time = SPLIT_WORK_LIMIT
    solver.parameters.catch_sigint_signal = False  # leave Ctrl-C to the plan
    return solver


def _stage_exprs(model: SplitModel, s: int, n: Any) -> list[Any]:
    """``t_f, t_b, t_w, m_b, static`` of stage ``s`` as expressions of its layer count."""
    return stage_total(n, model.layer, model.first, model.last, first=s == 0,
                       last=s == model.stages - 1)  # fmt: skip


def memory_levels(model: SplitModel) -> list[tuple[int, ...]]:
    """In-flight counts to split for: the reference, half of it, one microbatch per stage."""
    half = tuple(max(1, math.ceil(k / 2)) for k in model.k)
    levels = [model.k, half, (1,) * model.stages]
    return [k for i, k in enumerate(levels) if k not in levels[:i]]


def fits_in_total(model: SplitModel) -> bool:
    """Whether the devices together hold every stage's static memory and one microbatch's
    activations (a stage's memory is linear in its layers, so the sum over any split is the
    same): a split-free test that spares the split model the configurations no split fits."""
    per_layer = model.layer[3] + model.layer[4]
    ends = model.first[3] + model.first[4] + model.last[3] + model.last[4]
    held = sum(model.held(d) for d in range(model.p))
    return model.layers * per_layer + ends + held <= model.p * model.room


def memory_fits(model: SplitModel, k: Sequence[int]) -> bool:
    """Whether some split meets every device's memory row at in-flight counts ``k``: exactly
    when the most layers each device can hold (one per stage, the rest on its stage with
    the fewest in flight) add up to the model's layers. The split model's other rows only
    rank splits, so a level this rejects is one :func:`best_split` finds nothing at."""
    static, m_b = model.layer[4], model.layer[3]
    most = 0
    for d in range(model.p):
        mine = [s for s in range(model.stages) if model.devices[s] == d]
        used = model.held(d) + sum(static + k[s] * m_b for s in mine)
        used += sum(model.first[4] + k[0] * model.first[3] for s in mine if s == 0)
        last = model.stages - 1
        used += sum(model.last[4] + k[last] * model.last[3] for s in mine if s == last)
        left = model.room - used
        if left < 0:
            return False
        per = static + min(k[s] for s in mine) * m_b
        most += len(mine) + (left // per if per > 0 else model.layers)
    return most >= model.layers


def split_candidates(model: SplitModel, *, count: int = 3) -> list[tuple[int, ...]]:
    """Up to ``count`` distinct splits: the best and second best at the first level of
    :func:`memory_levels` that fits, then the best at one microbatch per stage when its proxy
    is lower. Empty when no split fits even one microbatch per stage."""
    out: list[tuple[int, ...]] = []
    if not fits_in_total(model):
        log.debug("%d layers with one microbatch per stage exceed every device together",
                  model.layers)  # fmt: skip
        return out
    levels = [k for k in memory_levels(model) if memory_fits(model, k)]
    for k in levels:
        first = best_split(model, k)
        if first is None:
            continue
        out.append(first)
        if count > 1:
            second = best_split(model, k, exclude=out)
            if second is not None:
                out.append(second)
        break
    if out and len(out) < count and levels[-1] != model.k:
        least = best_split(model, levels[-1], exclude=out)
        if least is not None and model.proxy(least) < model.proxy(out[0]):
            out.append(least)
    if not out:
        log.debug("no split of %d layers fits at one microbatch per stage", model.layers)
    return out[:count]
