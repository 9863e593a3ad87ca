"""Step 3 of a plan: each configuration's layer splits (:mod:`pp_opt.planner.split`)."""

from __future__ import annotations

from collections.abc import Sequence

from pp_opt.job import Job
from pp_opt.planner.config import Candidate, PlanInputs
from pp_opt.planner.split import split_candidates, split_model
from pp_opt.profiler.analytic import (
    expert_bytes_per_param,
    job_bytes_per_param,
    link_costs,
    unit_costs,
)


def config_splits(inputs: PlanInputs, job: Job, *, count: int) -> list[tuple[int, ...]]:
    """Up to ``count`` layer splits worth scheduling for ``job`` (none when nothing fits)."""
    layers = inputs.model.layers
    if job.stages == 1:
        return [(layers,)]
    units = unit_costs(inputs.model, inputs.hardware, job)
    t_comm = link_costs(inputs.model, inputs.hardware, job).t_comm
    model = split_model(job, units, layers=layers, bytes_per_param=job_bytes_per_param(job),
                        cap=inputs.hardware.cap_bytes, t_comm=t_comm,
                        expert_bytes_per_param=expert_bytes_per_param(job))  # fmt: skip
    return split_candidates(model, count=count)


def split_layers(
    inputs: PlanInputs, configs: Sequence[Candidate], *, count: int = 2
) -> tuple[list[Candidate], int]:
    """The candidates of ``configs`` with their layers split (splits shared by configurations
    that differ only in recompute and offload), and how many configurations had no split that
    fits."""
    cache: dict[Job, list[tuple[int, ...]]] = {}
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
