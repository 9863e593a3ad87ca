"""Step 3 of a plan: each configuration's layer splits (:mod:`pp_opt.plan.split`)."""

from __future__ import annotations

from collections.abc import Sequence

from pp_opt.plan.config import Candidate, Config, PlanInputs
from pp_opt.plan.split import split_candidates, split_model
from pp_opt.profiler.analytic import bytes_per_param, link_costs, unit_costs
from pp_opt.profiler.layout import Layout


def layout_of(inputs: PlanInputs, config: Config) -> Layout:
    """The profiler's layout of ``config`` (layers left out: per-layer costs do not need it)."""
    static = bytes_per_param(dp=config.dp, optimizer_sharding=config.optimizer_sharding)
    return Layout(pp=config.pp, v=config.v, placement=config.placement, microbatches=config.m,
                  mbs=config.mbs, seq=inputs.seq, tp=config.tp,
                  bytes_per_param=static)  # fmt: skip


def config_splits(inputs: PlanInputs, config: Config, *, count: int) -> list[tuple[int, ...]]:
    """Up to ``count`` layer splits worth scheduling for ``config`` (none when nothing fits)."""
    layers = inputs.model.layers
    if config.stages == 1:
        return [(layers,)]
    layout = layout_of(inputs, config)
    units = unit_costs(inputs.model, inputs.hardware, layout, tp_comm=True)
    t_comm = float(link_costs(inputs.model, inputs.hardware, layout)["t_comm"])
    model = split_model(config, units, layers=layers, bytes_per_param=layout.bytes_per_param,
                        cap=inputs.hardware.cap_bytes, t_comm=t_comm)  # fmt: skip
    return split_candidates(model, count=count)


def split_layers(
    inputs: PlanInputs, configs: Sequence[Config], *, count: int = 2
) -> tuple[list[Candidate], int]:
    """The candidates of ``configs`` (splits shared by configurations that differ only in
    recompute and offload), and how many configurations had no split that fits."""
    cache: dict[tuple[object, ...], list[tuple[int, ...]]] = {}
    out: list[Candidate] = []
    unsplit = 0
    for config in configs:
        key = (config.tp, config.pp, config.v, config.placement, config.mbs, config.m,
               config.dp, config.optimizer_sharding)  # fmt: skip
        if key not in cache:
            cache[key] = config_splits(inputs, config, count=count)
        splits = cache[key]
        if not splits:
            unsplit += 1
        out.extend(Candidate(config=config, layers=split) for split in splits)
    return out, unsplit
