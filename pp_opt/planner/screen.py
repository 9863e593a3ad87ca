"""Step 2b of a plan, for large searches: keep the configurations with the best split-free
bounds.

An MoE job on hundreds of GPUs has tens of thousands of legal configurations (its expert
degree times every other dimension); splitting and bounding each takes milliseconds, more
than a plan's time. Each configuration gets a bound that needs no split: its devices
together run every layer of every microbatch, so the busiest device runs at least the
``1 / pp`` share of ``m x`` (every layer's ``t_f + t_b + t_w`` plus the embedding and
output layer); and they together hold every stage's static memory and one microbatch's
activations, or no split fits (:func:`pp_opt.planner.split.fits_in_total`'s rule). The
:data:`LARGE_SEARCH` configurations with the least estimates (the bound times the classic
schedules' bubble factor) go on; the plan counts the rest.
Per-layer costs are computed once per set of fields they depend on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pp_opt.job import Job
from pp_opt.planner.config import Candidate, PlanInputs
from pp_opt.profiler.analytic import (
    UnitCosts,
    expert_bytes_per_param,
    job_bytes_per_param,
    unit_costs,
)

LARGE_SEARCH = 1000
"""Configurations a plan splits and bounds at most; beyond it, the best split-free estimates
(on DeepSeek-V3's 139k configurations, 2000 left too little solve time for each)."""
TOO_LARGE = "not screened: beyond the best split-free estimates of a large search"
NO_ROOM = "infeasible: the devices together cannot hold one microbatch per stage"


def _unit_key(job: Job) -> Job:
    """The job as far as its per-layer costs go (the pipeline shape does not change them)."""
    return replace(job, pp=1, v=1, placement="loop", layers=(), full_layers=(),
                   microbatches=1, optimizer_sharding=False)  # fmt: skip


def split_free_bound(inputs: PlanInputs, job: Job, units: UnitCosts) -> float | None:
    """A lower bound on the job's makespan without a split (ms), or None when its devices
    together cannot hold every stage at one microbatch each."""
    card = inputs.model
    dense = min(card.dense_layers, card.layers) if units.dense_layer else 0
    keys = ("t_f", "t_b", "t_w")

    def total(part: dict[str, float], count: int) -> float:
        return count * sum(part.get(k, 0.0) for k in keys)

    work = total(units.layer, card.layers - dense) + total(units.embedding, 1)
    work += total(units.head, 1) + (total(units.dense_layer, dense) if units.dense_layer else 0)
    per, experts = job_bytes_per_param(job), expert_bytes_per_param(job)

    def held(part: dict[str, float], count: int) -> float:
        e = part.get("expert_params", 0.0)
        return count * ((part["params"] - e) * per + e * experts + part["m_b"])

    memory = held(units.layer, card.layers - dense) + held(units.embedding, 1)
    memory += held(units.head, 1) + (held(units.dense_layer, dense) if units.dense_layer else 0)
    if memory > job.pp * inputs.hardware.cap_bytes:
        return None
    return job.microbatches * work / job.pp


def _bubble(job: Job) -> float:
    """The classic schedules' fill and drain over the steady state, ``1 + (p - 1) / (m v)``
    (interleaving shortens it): ranks configurations by what the bound leaves out."""
    return 1.0 + (job.pp - 1) / (job.microbatches * job.v)


def screen(
    inputs: PlanInputs, configs: Sequence[Candidate], *, keep: int = LARGE_SEARCH
) -> tuple[list[Candidate], dict[str, int]]:
    """``configs`` as they are when there are at most ``keep``; else the ``keep`` with the
    least split-free estimates (in their order), and the others counted by reason."""
    if len(configs) <= keep:
        return list(configs), {}
    cache: dict[Job, UnitCosts] = {}
    bounds: list[tuple[float, int]] = []
    dropped = {NO_ROOM: 0, TOO_LARGE: 0}
    for i, config in enumerate(configs):
        key = _unit_key(config.job)
        if key not in cache:
            cache[key] = unit_costs(inputs.model, inputs.hardware, key)
        bound = split_free_bound(inputs, config.job, cache[key])
        if bound is None:
            dropped[NO_ROOM] += 1
        else:
            bounds.append((bound, i))
    bounds = [(bound * _bubble(configs[i].job), i) for bound, i in bounds]
    bounds.sort()
    chosen = sorted(i for _, i in bounds[:keep])
    dropped[TOO_LARGE] = max(0, len(bounds) - keep)
    return [configs[i] for i in chosen], {k: v for k, v in dropped.items() if v}
