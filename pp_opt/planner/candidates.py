"""Step 3 of a plan: each configuration's layer splits (:mod:`pp_opt.planner.split`).

The split model's memory rows are the profiler's static terms
(:func:`pp_opt.profiler.analytic.static_memory_terms`) written in the split: the state and,
where a pipelined FSDP stage holds them, the all-gathered weights and accumulated gradients
per parameter of a stage's layers; what no split moves (receive buffers, the output logits,
a backward's transients, the allocator's cached buffers) per device, so that the rows are
the profiler's static bytes on the even split (an MoE model's dense layers, which the model
counts as MoE layers, make that part negative where they lie). On a card with a pipelined
step's fragmentation, the rows are reserved bytes as the profile's cap counts them: the
activations and the held gradients each with their share of it. Without them a split that
fits the model may overflow the profile (DeepSeek-V3 with FSDP: 1,880 of 1,960 split
candidates were then rejected as static memory over the cap).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from pp_opt.job import Job
from pp_opt.planner.config import Candidate, PlanInputs
from pp_opt.planner.split import MEMORY_SCALE, SplitModel, split_candidates, split_model
from pp_opt.profiler.analytic import (
    UnitCosts,
    expert_bytes_per_param,
    job_bytes_per_param,
    link_costs,
    reserved_static_terms,
    stage_costs,
    unit_costs,
)
from pp_opt.profiler.fsdp import unsharded_bytes
from pp_opt.profiler.memory_breakdown import (
    fragmentation_share,
    fsdp_param_bytes,
    holds_unsharded,
)


def held_per_param(job: Job, *, fragmentation: float = 0.0) -> tuple[float, float]:
    """Bytes per parameter a pipelined FSDP stage holds unsharded across the step (its
    all-gathered weights and accumulated gradients, the gradients' ``fragmentation`` share of
    reserved bytes with them), for the dense and the routed expert parameters (FSDP leaves
    experts whole when ``edp = 1``); zero otherwise."""
    if not holds_unsharded(job):
        return 0.0, 0.0
    grads = unsharded_bytes(1.0, param_bytes=0.0)
    held = unsharded_bytes(1.0, param_bytes=fsdp_param_bytes(job)) + fragmentation * grads
    return held, held if job.edp > 1 else 0.0


def even_split(layers: int, stages: int) -> tuple[int, ...]:
    """``layers`` over ``stages`` as evenly as can be, the remainder to the first stages."""
    per, extra = divmod(layers, stages)
    return tuple(per + (s < extra) for s in range(stages))


def config_split_model(inputs: PlanInputs, job: Job, units: UnitCosts | None = None
                       ) -> SplitModel:  # fmt: skip
    """The split model of ``job`` (layers not split yet; ``job.stages <= layers``), its
    memory rows the profiler's static terms (see the module)."""
    card, hw = inputs.model, inputs.hardware
    units = unit_costs(card, hw, job) if units is None else units
    share = fragmentation_share(hw, job)  # on the held gradients and the activations
    dense, experts = held_per_param(job, fragmentation=share)
    per, per_expert = job_bytes_per_param(job) + dense, expert_bytes_per_param(job) + experts
    t_comm = link_costs(card, hw, job).t_comm
    model = split_model(job, units, layers=card.layers, bytes_per_param=per,
                        cap=hw.cap_bytes, t_comm=t_comm, expert_bytes_per_param=per_expert,
                        activation_scale=1 + share)  # fmt: skip
    split = even_split(card.layers, job.stages)
    even = job.with_layers(split)
    real = [sum(t.values()) for t in reserved_static_terms(card, stage_costs(card, hw, even),
                                                            even, hw)]  # fmt: skip
    mine = model.memory(split, (0,) * model.stages)  # the layers' state as the model counts it
    reserved = tuple(math.ceil(r / MEMORY_SCALE) - x for r, x in zip(real, mine, strict=True))
    return replace(model, reserved=reserved)


def config_splits(inputs: PlanInputs, job: Job, *, count: int) -> list[tuple[int, ...]]:
    """Up to ``count`` layer splits worth scheduling for ``job`` (none when nothing fits)."""
    layers = inputs.model.layers
    if job.stages == 1:
        return [(layers,)]
    return split_candidates(config_split_model(inputs, job), count=count)


def split_layers(
    inputs: PlanInputs, configs: Sequence[Candidate], *, count: int = 2,
    cache: dict[Job, list[tuple[int, ...]]] | None = None,
) -> tuple[list[Candidate], int]:  # fmt: skip
    """The candidates of ``configs`` with their layers split (splits shared by configurations
    that differ only in recompute and offload, through ``cache``: job -> splits), and how
    many configurations had no split that fits."""
    cache = {} if cache is None else cache
    out: list[Candidate] = []
    unsplit = 0
    for config in configs:
        if config.job not in cache:
            cache[config.job] = config_splits(inputs, config.job, count=count)
        splits = cache[config.job]
        if not splits:
            unsplit += 1
        out.extend(Candidate(job=config.job.with_layers(split), recompute=config.recompute,
                             offload=config.offload) for split in splits)  # fmt: skip
    return out, unsplit
