"""Step 2b of a plan, for large searches: keep the configurations with the best split-free
bounds.

An MoE job on hundreds of GPUs has tens of thousands of legal configurations (its expert
degree times every other dimension); splitting and bounding each takes milliseconds, more
than a plan's time. Each configuration gets a bound that needs no split: its devices
together run every layer of every microbatch, so the busiest device runs at least the
``1 / pp`` share of ``m x`` (every layer's ``t_f + t_b + t_w`` plus the embedding and
output layer); and they together hold every stage's static memory and one microbatch's
activations, or no split fits (:func:`pp_opt.planner.split.fits_in_total`'s rule). The
:data:`LARGE_SEARCH` configurations with the least estimates go on; the plan counts the rest.
The estimate is the larger of that bound times the classic schedules' bubble factor and
Little's law on the activations (:func:`memory_time_bound`): a deep pipeline on few devices
whose activations barely fit runs its microbatches nearly one at a time, which the bubble
factor alone ranks first (Llama 3.1 405B on 512 GPUs: tp8 pp4 v11, 44 stages, 16
microbatches, before every pp16 configuration).
Per-layer costs are computed once per set of fields they depend on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pp_opt.job import Job
from pp_opt.planner.config import Candidate, PlanInputs
from pp_opt.planner.split import fits_in_total, memory_fits
from pp_opt.profiler.analytic import (
    UnitCosts,
    expert_bytes_per_param,
    job_bytes_per_param,
    unit_costs,
)
from pp_opt.profiler.memory_breakdown import fragmentation_share
from pp_opt.profiler.stacks import load_stack_card

LARGE_SEARCH = 1000
"""Configurations a plan splits and bounds at most; beyond it, the best split-free estimates
(on DeepSeek-V3's 139k configurations, 2000 left too little solve time for each)."""
TOO_LARGE = "not screened: beyond the best split-free estimates of a large search"
NO_ROOM = "infeasible: the devices together cannot hold one microbatch per stage"
DOMINATED = (
    "not screened: a twin that computes no more (no recompute or offload, lighter "
    "checkpointing, plain data parallelism) fits the classic schedule"
)


def _unit_key(job: Job) -> Job:
    """The job as far as its per-layer costs go (the pipeline shape does not change them)."""
    return replace(job, pp=1, v=1, placement="loop", layers=(), full_layers=(),
                   microbatches=1, optimizer_sharding=False)  # fmt: skip


def split_free_bound(inputs: PlanInputs, job: Job, units: UnitCosts) -> float | None:
    """A lower bound on the job's makespan without a split (ms): the busiest device's share
    of the work; None when its devices together cannot hold every stage at one microbatch
    each."""
    parts = _layer_parts(inputs, units)
    work = sum(count * (p.get("t_f", 0.0) + p.get("t_b", 0.0) + p.get("t_w", 0.0))
               for p, count in parts)  # fmt: skip
    memory = _static_bytes(job, parts) + sum(count * p.get("m_b", 0.0) for p, count in parts)
    if memory > job.pp * inputs.hardware.cap_bytes:
        return None
    return job.microbatches * work / job.pp


def memory_time_bound(inputs: PlanInputs, job: Job, units: UnitCosts) -> float:
    """A lower bound on the makespan without a split (ms) for schedules that keep every
    activation (no recompute, no offload): Little's law over all devices together
    (:func:`pp_opt.bounds.memory_area` without a split). Each layer's activation is held from
    its forward's start to its backward's end, at least the round trip through it and every
    layer above; all devices hold at most their room between them: ``pp`` usable memories
    less every layer's static bytes, over ``1 +`` the allocator's fragmentation (as
    :func:`pp_opt.profiler.memory_breakdown.cap_bytes` lowers a device's cap)."""
    parts = _layer_parts(inputs, units)
    area, above = 0.0, 0.0  # memory-time of one microbatch; the round trip above a layer
    for part, count in reversed(parts):
        trip = part.get("t_f", 0.0) + part.get("t_b", 0.0)
        # ``count`` layers of one kind, top first: the i-th from the top has i trips to make
        area += part.get("m_b", 0.0) * (count * above + trip * count * (count + 1) / 2)
        above += count * trip
    share = fragmentation_share(inputs.hardware, job)
    room = (job.pp * inputs.hardware.usable_bytes - _static_bytes(job, parts)) / (1 + share)
    return job.microbatches * area / room if room > 0 else 0.0


def _layer_parts(inputs: PlanInputs, units: UnitCosts) -> list[tuple[dict[str, float], int]]:
    """The model's parts bottom to top, with their counts: the embedding, the dense first
    layers, the other layers, the output layer."""
    card = inputs.model
    dense = min(card.dense_layers, card.layers) if units.dense_layer else 0
    return [(units.embedding, 1), (units.dense_layer or {}, dense),
            (units.layer, card.layers - dense), (units.head, 1)]  # fmt: skip


def _static_bytes(job: Job, parts: list[tuple[dict[str, float], int]]) -> float:
    """Weights, gradients and optimizer state of every part (the job's bytes per parameter)."""
    per, experts = job_bytes_per_param(job), expert_bytes_per_param(job)
    total = 0.0
    for part, count in parts:
        e = part.get("expert_params", 0.0)
        total += count * ((part.get("params", 0.0) - e) * per + e * experts)
    return total


def _bubble(job: Job) -> float:
    """The classic schedules' fill and drain over the steady state, ``1 + (p - 1) / (m v)``
    (interleaving shortens it): ranks configurations by what the bound leaves out."""
    return 1.0 + (job.pp - 1) / (job.microbatches * job.v)


def _twins(config: Candidate, modes: Sequence[str]) -> list[Candidate]:
    """The configurations that ``config`` is worth trying only when none of them fits the
    classic schedule's memory: the same without recompute and offload; the same with a
    checkpointing mode that recomputes less (earlier in the stack's ``modes``); the same on
    plain data parallelism (``dp_shard = 1``; the optimizer sharded too where the stack can)
    instead of FSDP.
    Each runs the same layers at no more compute and, where it fits, no more memory
    pressure; FSDP's gathers and reduce-scatters cost what DP's all-reduce does or more."""
    job, out = config.job, []
    if config.recompute or config.offload:
        out.append(replace(config, recompute=False, offload=False))
    plain = replace(config, recompute=False, offload=False)
    if job.ac in modes:
        out += [replace(plain, job=replace(job, ac=mode)) for mode in modes[: modes.index(job.ac)]]
    if job.dp_shard > 1 and job.dp_shard == job.dp:
        zero = load_stack_card(job.stack).optimizer == "distributed"
        for sharded in (True, False)[not zero :]:
            flat = replace(job, dp_shard=1, dp_replicate=0, optimizer_sharding=sharded,
                           fp8_all_gather=None)  # fmt: skip
            out.append(replace(plain, job=flat))
    return out


class _Memory:
    """Split models of configurations, made once each: whether some split fits at one
    microbatch per stage, and at the placement's classic in-flight counts."""

    def __init__(self, inputs: PlanInputs) -> None:
        self.inputs = inputs
        self._fits: dict[Job, tuple[bool, bool]] = {}

    def fits(self, job: Job) -> tuple[bool, bool]:
        """``(fits at one microbatch per stage, fits the classic schedule)``."""
        if job not in self._fits:
            from pp_opt.planner.candidates import config_split_model

            model = config_split_model(self.inputs, job)
            least = fits_in_total(model) and memory_fits(model, (1,) * model.stages)
            self._fits[job] = (least, least and memory_fits(model, model.k))
        return self._fits[job]

    def dominated(self, config: Candidate, modes: Sequence[str], present: set[Candidate]
                  ) -> bool:  # fmt: skip
        return any(twin in present and self.fits(twin.job)[1]
                   for twin in _twins(config, modes))  # fmt: skip


def screen(
    inputs: PlanInputs, configs: Sequence[Candidate], *, keep: int = LARGE_SEARCH
) -> tuple[list[Candidate], dict[str, int]]:
    """``configs`` as they are when there are at most ``keep``; else, in the order of their
    split-free estimates, the first ``keep`` that some split fits (the split model's memory
    rows at one microbatch per stage) and that no twin dominates (:func:`_twins`: one that
    computes no more fits the classic schedule), best estimate first; the others counted by
    reason."""
    if len(configs) <= keep:
        return list(configs), {}
    cache: dict[Job, UnitCosts] = {}
    bounds: list[tuple[float, int]] = []
    dropped = {NO_ROOM: 0, DOMINATED: 0, TOO_LARGE: 0}
    for i, config in enumerate(configs):
        key = _unit_key(config.job)
        if key not in cache:
            cache[key] = unit_costs(inputs.model, inputs.hardware, key)
        bound = split_free_bound(inputs, config.job, cache[key])
        if bound is None:
            dropped[NO_ROOM] += 1
        else:
            # A recompute or offload variant ranks with its twin: the memory term is what
            # it may relieve, at a cost the estimate does not know.
            held = memory_time_bound(inputs, config.job, cache[key])
            bounds.append((max(bound * _bubble(config.job), held), i))
    bounds.sort()
    memory = _Memory(inputs)
    present = set(configs)
    chosen: list[int] = []
    for n, (_, i) in enumerate(bounds):
        if len(chosen) == keep:
            dropped[TOO_LARGE] = len(bounds) - n
            break
        config = configs[i]
        if config.job.stages > 1 and not memory.fits(config.job)[0]:
            dropped[NO_ROOM] += 1
        elif memory.dominated(config, load_stack_card(config.job.stack).ac_modes, present):
            dropped[DOMINATED] += 1
        else:
            chosen.append(i)
    return [configs[i] for i in chosen], {k: v for k, v in dropped.items() if v}
