"""Cost profiler: from a model card, a hardware card and a parallel layout to stage costs.

``profile_costs`` returns the cost profile JSON (``"format": "pp-opt.costs"``);
``profile_problem`` returns the Problem it describes. Costs come from formulas (analytic, the
default) or from timing real PyTorch modules on the device at hand (``measure=True``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pp_opt.arguments import check_profile, integer
from pp_opt.compat import renamed
from pp_opt.errors import ProblemError
from pp_opt.problem import Problem
from pp_opt.problem_io import problem_from_costs
from pp_opt.profiler.analytic import profile_analytic
from pp_opt.profiler.cards import (
    HardwareCard,
    ModelCard,
    load_hardware_card,
    load_model_card,
)
from pp_opt.profiler.costs import costs_dict
from pp_opt.profiler.layout import Layout, make_layout

__all__ = [
    "HardwareCard",
    "Layout",
    "ModelCard",
    "load_hardware_card",
    "load_model_card",
    "problem_from_costs",
    "profile_costs",
    "profile_problem",
]


def profile_costs(
    *,
    model: str | Path | ModelCard,
    hardware: str | Path | HardwareCard | None = None,
    pp: int,
    v: int = 1,
    placement: str = "loop",
    microbatches: int,
    mbs: int = 1,
    seq: int | None = None,
    tp: int = 1,
    layers: list[int] | None = None,
    measure: bool = False,
    recompute: str = "none",
    bytes_per_param: float = 16.0,
    repeats: int = 10,
    warmup: int = 2,
    threads: int | None = None,
    vpp: int | None = None,
    concurrent: bool = False,
    tp_comm: bool = False,
) -> dict[str, Any]:
    """Profile one layout and return its cost profile JSON (a dict).

    Parameters
    ----------
    model, hardware
        Card paths, bundled card names (``"llama2-7b"``, ``"a100-80gb"``) or loaded cards.
        ``hardware`` may be left out only to measure on a machine without CUDA: the ``cpu``
        card then gives the cap, the links and the copy bandwidth.
    pp, v, placement
        Pipeline size, chunks per device and ``loop``/``v`` placement (the ``v`` placement
        implies ``v = 2``).
    microbatches, mbs, seq
        Microbatches per iteration, sequences per microbatch, sequence length (card default).
    tp
        Tensor-parallel degree; sequence parallelism is assumed (all activations split).
    layers
        Decoder layers per stage when they do not split evenly (``pp * v`` entries).
    measure
        Run every stage with PyTorch on CUDA if present, else CPU, and time the actions the
        pipeline runtime executes (F, its I/W split, the fused B, offload copies) instead of
        using formulas. Static memory, caps and links stay analytic.
    recompute
        ``none`` or ``selective`` (attention core recomputed in B, score matrix not kept).
    bytes_per_param
        Static bytes per parameter (16: bf16 weights and grads, fp32 master and Adam moments).
    repeats, warmup
        Timed and untimed runs per measurement (``measure`` only); each cost is the median,
        kept with its interquartile range in ``profile.stages[s].timings``.
    threads
        Torch CPU threads while measuring (default: torch's current setting; with
        ``concurrent`` on CPU, the cores divided among the devices).
    concurrent
        Time all devices' stages at the same time, one process per device, so the contention
        of a running pipeline is in the numbers (``measure`` only).
    vpp
        Former name of ``v`` (deprecated).
    tp_comm
        Add the tensor-parallel collectives to each layer's F and B (analytic profiles; off
        by default, as profiles were made before; the planner turns it on).
    """
    v = renamed("vpp", None if vpp is None else integer("vpp", vpp, low=1), "v", v)
    check_profile(measure=measure, layers=layers)
    integer("repeats", repeats, low=1, high=100_000)
    integer("warmup", warmup, low=0, high=100_000)
    if threads is not None:
        integer("threads", threads, low=1, high=1024)
    card = load_model_card(model)
    hw = load_hardware_card(_default_hardware(hardware, measure))
    layout = make_layout(
        card, pp=pp, v=v, placement=placement, microbatches=microbatches, mbs=mbs, seq=seq,
        tp=tp, layers=layers, recompute=recompute, bytes_per_param=bytes_per_param,
    )  # fmt: skip
    profile = profile_analytic(card, hw, layout, tp_comm=tp_comm)
    kind = "analytic"
    if measure:
        from pp_opt.profiler.measured import measure_profile

        profile = measure_profile(
            card, hw, layout, profile, repeats=repeats, warmup=warmup, threads=threads,
            concurrent=concurrent,
        )  # fmt: skip
        kind = "measured"
    data = costs_dict(kind=kind, card=card, hw=hw, layout=layout, **profile)
    if tp_comm:
        data["profile"]["tp_comm"] = True
    return data


def profile_problem(
    *,
    model: str | Path | ModelCard,
    hardware: str | Path | HardwareCard | None = None,
    pp: int,
    v: int = 1,
    placement: str = "loop",
    microbatches: int,
    mbs: int = 1,
    seq: int | None = None,
    tp: int = 1,
    layers: list[int] | None = None,
    measure: bool = False,
    vpp: int | None = None,
    **options: Any,
) -> Problem:
    """Profile one layout and return the Problem to solve.

    Parameters
    ----------
    model, hardware, pp, v, placement, microbatches, mbs, seq, tp, layers, measure
        As in :func:`profile_costs`; ``vpp`` is the former name of ``v`` (deprecated).
    **options
        The other keywords of :func:`profile_costs` (``recompute``, ``bytes_per_param``,
        ``repeats``, ``warmup``, ``threads``).

    Returns
    -------
    Problem
        The problem the cost profile describes (unit ``bytes``), its provenance in
        ``extra["profile"]``.
    """
    v = renamed("vpp", None if vpp is None else integer("vpp", vpp, low=1), "v", v)
    data = profile_costs(
        model=model, hardware=hardware, pp=pp, v=v, placement=placement,
        microbatches=microbatches, mbs=mbs, seq=seq, tp=tp, layers=layers, measure=measure,
        **options,
    )  # fmt: skip
    return problem_from_costs(data)


def _default_hardware(
    hardware: str | Path | HardwareCard | None, measure: bool
) -> str | Path | HardwareCard:
    if hardware is not None:
        return hardware
    if measure:
        from pp_opt.profiler.measured import require_torch

        if not require_torch().cuda.is_available():
            return "cpu"
    raise ProblemError(
        "hardware", "no hardware card; give one (e.g. 'a100-80gb'), or 'cpu' to run on a CPU"
    )
