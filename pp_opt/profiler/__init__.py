"""Cost profiler: from a model card, a hardware card and a job to stage costs.

``profile_job`` returns the :class:`CostProfile` of one :class:`~pp_opt.job.Job`, and
:func:`problem_from_profile` the Problem it describes; ``profile_costs`` (its file,
``"format": "pp-opt.costs"``) and ``profile_problem`` take the job's fields as keywords.
Costs come from formulas (analytic, the default) or from timing real PyTorch modules on the
device at hand (``measure=True``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pp_opt.arguments import check_profile, flag, integer, of_type, optional
from pp_opt.compat import renamed
from pp_opt.errors import ProblemError
from pp_opt.job import Job
from pp_opt.problem import Problem
from pp_opt.problem_io import problem_from_costs
from pp_opt.profiler.analytic import profile_analytic
from pp_opt.profiler.cards import (
    HardwareCard,
    ModelCard,
    load_hardware_card,
    load_model_card,
)
from pp_opt.profiler.costs import CostProfile, LinkCosts, StageCost, problem_from_profile
from pp_opt.profiler.layer_split import job_for_card

__all__ = [
    "CostProfile",
    "HardwareCard",
    "Job",
    "LinkCosts",
    "ModelCard",
    "StageCost",
    "load_hardware_card",
    "load_model_card",
    "problem_from_costs",
    "problem_from_profile",
    "profile_costs",
    "profile_job",
    "profile_of",
    "profile_problem",
]


def profile_job(
    job: Job,
    *,
    model: str | Path | ModelCard,
    hardware: str | Path | HardwareCard | None = None,
    measure: bool = False,
    **measuring: Any,
) -> CostProfile:
    """The cost profile of ``job`` (layers split evenly unless it gives them).

    Every command and function that needs costs comes here, so the same configuration gets
    the same costs from ``profile``, ``solve --model``, ``predict`` and ``plan``.

    Parameters
    ----------
    job
        The configuration: degrees, chunks and placement, microbatches, layers per stage,
        activation checkpointing and kernel options.
    model, hardware
        Card names, card paths or loaded cards; ``hardware`` None: ``cpu`` when measuring,
        else an error.
    measure
        Time each stage with PyTorch instead of the analytic formulas (needs ``torch``).
    measuring
        ``repeats``, ``warmup``, ``threads``, ``concurrent`` of a measured profile (see
        :func:`profile_of`).

    Returns
    -------
    CostProfile
        Per-stage times (ms) and memory (bytes), links and static memory;
        :func:`problem_from_profile` makes the problem a solver takes.
    """
    of_type("job", job, Job, "a pp_opt Job")
    of_type("model", model, (str, Path, ModelCard), "a model card's name or path, or a ModelCard")
    optional("hardware", hardware, (str, Path, HardwareCard), "a hardware card's name or path")
    flag("measure", measure)
    card = load_model_card(model)
    hw = load_hardware_card(_default_hardware(hardware, measure))
    profile = profile_analytic(card, hw, job_for_card(card, job))
    if measure:
        from pp_opt.profiler.torch.measured import measure_profile

        profile = measure_profile(card, hw, profile, **measuring)
    return profile


def profile_of(
    *, model: str | Path | ModelCard, hardware: str | Path | HardwareCard | None = None,
    pp: int, v: int = 1, placement: str = "loop", microbatches: int, mbs: int = 1,
    seq: int | None = None, tp: int = 1, layers: list[int] | None = None, measure: bool = False,
    recompute: str = "none", bytes_per_param: float = 16.0, repeats: int = 10, warmup: int = 2,
    threads: int | None = None, vpp: int | None = None, concurrent: bool = False,
    tp_comm: bool = True, dp_shard: int = 1, dp_replicate: int = 1, cp: int = 1,
    fp8: bool = False, compile: bool = False, async_tp: bool = False,
    full_layers: list[int] | None = None,
) -> CostProfile:  # fmt: skip
    """Profile one configuration given by its fields and return its :class:`CostProfile`.

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
        Activation checkpointing: ``none``, ``selective`` (attention core recomputed in B),
        ``selective_op`` (torchtitan's op-level policy) or ``full`` (:mod:`.checkpointing`).
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
        The tensor-parallel collectives are exposed: added to each layer's F and B when
        ``tp > 1`` (the one cost model of ``profile``, ``solve --model`` and ``plan``).
    dp_shard, dp_replicate, cp, fp8, compile, async_tp, full_layers
        FSDP shard and replica degrees, context parallelism, Float8 linears, torch.compile,
        AsyncTP, and per stage the fully checkpointed layers (:class:`pp_opt.job.Job`).
        With ``dp_shard > 1`` the static bytes come from FSDP's sharding, not
        ``bytes_per_param``.
    """
    v = renamed("vpp", None if vpp is None else integer("vpp", vpp, low=1), "v", v)
    check_profile(measure=measure, layers=layers)
    integer("repeats", repeats, low=1, high=100_000)
    integer("warmup", warmup, low=0, high=100_000)
    if threads is not None:
        integer("threads", threads, low=1, high=1024)
    card = load_model_card(model)
    job = Job(
        pp=pp, v=v, placement=placement, microbatches=microbatches, mbs=mbs,
        seq=card.seq if seq is None else seq, tp=tp, layers=tuple(layers or ()),
        activation_checkpoint=recompute, bytes_per_param=bytes_per_param, tp_comm=tp_comm,
        dp_shard=dp_shard, dp_replicate=dp_replicate, cp=cp, fp8=fp8, compile=compile,
        async_tp=async_tp, full_layers=tuple(full_layers or ()),
    )  # fmt: skip
    measuring = dict(repeats=repeats, warmup=warmup, threads=threads, concurrent=concurrent)
    return profile_job(job, model=card, hardware=hardware, measure=measure, **measuring)


def profile_costs(**options: Any) -> dict[str, Any]:
    """Profile one configuration and return its cost profile file (a dict); the keywords
    are those of :func:`profile_of`."""
    return profile_of(**options).to_dict()


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
        As in :func:`profile_of`; ``vpp`` is the former name of ``v`` (deprecated).
    **options
        The other keywords of :func:`profile_of` (``recompute``, ``bytes_per_param``,
        ``repeats``, ``warmup``, ``threads``).

    Returns
    -------
    Problem
        The problem the cost profile describes (unit ``bytes``), its provenance in
        ``extra["profile"]``.
    """
    v = renamed("vpp", None if vpp is None else integer("vpp", vpp, low=1), "v", v)
    profile = profile_of(
        model=model, hardware=hardware, pp=pp, v=v, placement=placement,
        microbatches=microbatches, mbs=mbs, seq=seq, tp=tp, layers=layers, measure=measure,
        **options,
    )  # fmt: skip
    return problem_from_profile(profile)


def _default_hardware(
    hardware: str | Path | HardwareCard | None, measure: bool
) -> str | Path | HardwareCard:
    if hardware is not None:
        return hardware
    if measure:
        from pp_opt.profiler.torch.measured import require_torch

        if not require_torch().cuda.is_available():
            return "cpu"
    raise ProblemError(
        "hardware", "no hardware card; give one (e.g. 'a100-80gb'), or 'cpu' to run on a CPU"
    )
