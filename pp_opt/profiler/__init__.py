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
from pp_opt.job import FIELDS, RENAMED, Job
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
    seq: int | None = None, measure: bool = False, repeats: int = 10, warmup: int = 2,
    threads: int | None = None, vpp: int | None = None, concurrent: bool = False,
    **fields: Any,
) -> CostProfile:  # fmt: skip
    """Profile one configuration given by its fields and return its :class:`CostProfile`.

    Parameters
    ----------
    model, hardware
        Card paths, bundled card names (``"llama2-7b"``, ``"a100-80gb"``) or loaded cards.
        ``hardware`` may be left out only to measure on a machine without CUDA: the ``cpu``
        card then gives the cap, the links and the copy bandwidth.
    seq
        Sequence length (the card's default when None).
    measure
        Run every stage with PyTorch on CUDA if present, else CPU, and time the actions the
        pipeline runtime executes (F, its I/W split, the fused B, offload copies) instead of
        using formulas. Static memory, caps and links stay analytic.
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
    **fields
        The :class:`~pp_opt.job.Job`'s fields: ``pp`` and ``microbatches`` (required),
        ``v``, ``placement``, ``mbs``, ``tp``, ``layers``, ``ac`` (activation checkpointing;
        ``recompute`` is its former name), ``bytes_per_param``, ``tp_comm``, ``dp_shard``,
        ``dp_replicate``, ``cp``, ``fp8``, ``compile``, ``async_tp``, ``full_layers``,
        ``ep``, ``etp``, ``dispatcher``, ... (each left out takes the Job's default).
    """
    fields = {RENAMED.get(k, k): v for k, v in fields.items() if v is not None}
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise ProblemError(unknown[0], f"not a job field; use one of {', '.join(FIELDS)}")
    for name in ("pp", "microbatches"):
        if name not in fields:
            raise ProblemError(name, "missing; give the pipeline size and the microbatches")
    fields["v"] = renamed("vpp", None if vpp is None else integer("vpp", vpp, low=1), "v",
                          fields.get("v", 1))  # fmt: skip
    check_profile(measure=measure, layers=fields.get("layers"))
    integer("repeats", repeats, low=1, high=100_000)
    integer("warmup", warmup, low=0, high=100_000)
    if threads is not None:
        integer("threads", threads, low=1, high=1024)
    card = load_model_card(model)
    for name in ("layers", "full_layers"):
        fields[name] = tuple(fields.get(name) or ())
    job = Job(seq=card.seq if seq is None else seq, **fields)
    measuring = dict(repeats=repeats, warmup=warmup, threads=threads, concurrent=concurrent)
    return profile_job(job, model=card, hardware=hardware, measure=measure, **measuring)


def profile_costs(**options: Any) -> dict[str, Any]:
    """Profile one configuration and return its cost profile file (a dict); the keywords
    are those of :func:`profile_of`."""
    return profile_of(**options).to_dict()


def profile_problem(**options: Any) -> Problem:
    """Profile one layout and return the Problem to solve.

    Parameters
    ----------
    **options
        The keywords of :func:`profile_of`: the cards, the job's fields (``pp``,
        ``microbatches``, ``v``, ``placement``, ``tp``, ``layers``, ``ac``, ...) and the
        measuring options.

    Returns
    -------
    Problem
        The problem the cost profile describes (unit ``bytes``), its provenance in
        ``extra["profile"]``.
    """
    return problem_from_profile(profile_of(**options))


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
