"""Predict one fully pinned configuration: its step time, throughput and peak memory.

``pp-opt predict`` and :func:`predict` evaluate exactly what a plan's candidates are
evaluated with (:func:`pp_opt.planner.evaluate.evaluate`: the analytic profile, the
schedule, the step time), so a plan is a search over predictions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pp_opt.arguments import choice, integer, number, of_type
from pp_opt.errors import ProblemError
from pp_opt.frameworks.pytorch import PYTORCH_SCHEDULES, check_schedule_fits
from pp_opt.frameworks.torchtitan import default_layers, default_stages_per_rank
from pp_opt.job import BATCH_SPLIT, FIELDS, RENAMED, Job, microbatch_count
from pp_opt.planner.config import Candidate, PlanInputs
from pp_opt.planner.evaluate import SOLVED, EvaluationTask, Scored, evaluate
from pp_opt.profiler.cards import HardwareCard, ModelCard, load_hardware_card, load_model_card
from pp_opt.profiler.layer_split import even_split, job_for_card
from pp_opt.profiler.stacks import check_expert_layout, named_stack

FORMAT = "pp-opt.prediction"
VERSION = 1
SOLVED_NAME = "pp_opt"
"""``--schedule`` of the solved order."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Prediction:
    """What one configuration is predicted to do (times in ms, memory in bytes)."""

    config: dict[str, Any]
    """The configuration (the job's fields and the training job's)."""
    schedule: str
    """``pp_opt`` (solved) or the PyTorch schedule's name."""
    step_time: float | None
    """One optimizer step (None: no schedule)."""
    tokens_per_s_per_gpu: float | None
    """Global tokens per second per GPU (torchtitan's TPS/GPU)."""
    mfu: float | None
    """Model FLOPs utilisation (recompute not counted)."""
    peak_memory: list[float]
    """Per pipeline rank: the peak as the stack reports it (``reserved`` bytes for torchtitan,
    ``allocated`` for Megatron-Core and NeMo: the stack card's ``memory_report``)."""
    status: str
    """The schedule's status (``optimal``, ``feasible``, ``heuristic``), or why none."""
    gap: float | None
    """The schedule's gap to its makespan lower bound."""
    iteration_makespan: float | None = None
    """The pipeline's makespan."""
    dp_sync: float | None = None
    """Data-parallel communication past the makespan (gradient sync, FSDP's exposed gathers)."""
    optimizer_step: float | None = None
    """The optimizer step."""
    note: str = ""
    """Why there is no schedule."""
    memory_breakdown: list[dict[str, float]] = field(default_factory=list)
    """Per pipeline rank: the named terms of its peak (bytes) and their sums ``allocated``
    and ``reserved``; ``reserved`` is ``peak_memory`` (:mod:`pp_opt.profiler.memory_breakdown`)."""

    def to_dict(self) -> dict[str, Any]:
        """The prediction file (``"format": "pp-opt.prediction"``)."""
        return {
            "format": FORMAT, "version": VERSION, "config": self.config,
            "schedule": self.schedule, "step_time": self.step_time,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "mfu": self.mfu,
            "peak_memory": self.peak_memory, "status": self.status, "gap": self.gap,
            "iteration_makespan": self.iteration_makespan, "dp_sync": self.dp_sync,
            "optimizer_step": self.optimizer_step, "note": self.note,
            "memory_breakdown": [dict(rank) for rank in self.memory_breakdown],
        }  # fmt: skip

    @classmethod
    def from_scored(cls, scored: Scored, inputs: PlanInputs) -> Prediction:
        """The prediction of one evaluated candidate."""
        job = scored.candidate.job
        config = {**inputs.to_dict(), **job.fields_dict()}
        return cls(
            config=config, schedule=SOLVED_NAME if scored.order == SOLVED else scored.order,
            step_time=scored.step_time, tokens_per_s_per_gpu=scored.tokens_per_s_per_gpu,
            mfu=scored.mfu, peak_memory=list(scored.peak_memory), status=scored.status,
            gap=scored.gap, iteration_makespan=scored.iteration_makespan,
            dp_sync=scored.dp_sync, optimizer_step=scored.optimizer_step,
            note=scored.note + _peak_clause(scored.largest_term),
            memory_breakdown=[dict(rank) for rank in scored.memory_breakdown],
        )  # fmt: skip


def _peak_clause(largest_term: str) -> str:
    """An infeasible prediction's largest term (its note says what the card holds)."""
    return f"; largest term at its peak: {largest_term}" if largest_term else ""


def schedule_names() -> tuple[str, ...]:
    """``pp_opt`` and PyTorch's schedule names."""
    return (SOLVED_NAME, *PYTORCH_SCHEDULES)


PREDICT_FIELDS = tuple(name for name in FIELDS if name not in ("dp", "microbatches", "seq"))
"""The Job fields :func:`predict` takes as keywords (``dp`` and the microbatches follow from
the degrees and the batch)."""


def data_parallel_degrees(gpus: int, given: dict[str, Any], *, fsdp: bool) -> dict[str, int]:
    """The five degrees, checked to multiply to ``gpus``. Data-parallel degrees left out take
    the ranks the others leave, as the frameworks do: FSDP's shard degree where the stack
    shards with FSDP (``fsdp``; torchtitan's ``data_parallel_shard_degree = -1``), else the
    replicas (Megatron-Core's data parallelism)."""
    degrees = {k: given.get(k, 1) for k in ("tp", "pp", "cp", "dp_shard")}
    degrees["dp_replicate"] = given.get("dp_replicate") or 1
    for name, value in degrees.items():
        integer(name, value, low=1)
    rest, left = divmod(gpus, math.prod(degrees.values()))
    if "dp_shard" not in given and not left:
        if fsdp or "dp_replicate" in given:
            degrees["dp_shard"] = rest
        else:
            degrees["dp_replicate"] = rest
    product = math.prod(degrees.values())
    if product != gpus:
        raise ProblemError(
            "gpus", f"{gpus} GPUs but tp x pp x cp x dp_shard x dp_replicate = {product}; "
            "give degrees whose product is the GPU count",
        )  # fmt: skip
    return degrees


def prediction_job(
    card: ModelCard, *, gpus: int, global_batch: int, seq: int, schedule: str,
    **fields: Any,
) -> Job:  # fmt: skip
    """The pinned job: degrees checked against ``gpus``, microbatches from the batch; for a
    PyTorch schedule, ``v`` as torchtitan builds it, checked to fit the schedule, and layers
    split as torchtitan splits them (for ``pp_opt`` evenly where the stages divide them).
    ``fields``: the Job's fields (:data:`PREDICT_FIELDS`; None or absent: the Job's
    default)."""
    given = {RENAMED.get(k, k): v for k, v in fields.items() if v is not None}
    unknown = sorted(set(given) - set(PREDICT_FIELDS))
    if unknown:
        names = ", ".join(PREDICT_FIELDS)
        raise ProblemError(unknown[0], f"not a setting of predict; use one of {names}")
    framework = named_stack(given)  # a bad name fails here, before the degrees
    degrees = data_parallel_degrees(gpus, given, fsdp=framework.optimizer == "fsdp")
    dp = degrees["dp_shard"] * degrees["dp_replicate"]
    given.update(degrees)
    split = {name: given[name] for name in BATCH_SPLIT if name in given}
    microbatches = microbatch_count(global_batch=global_batch, dp=dp, **split)
    if "v" not in given:  # the v placement lifts it to 2 (Job)
        given["v"] = 1 if schedule == SOLVED_NAME else default_stages_per_rank(schedule)
    job = Job(microbatches=microbatches, seq=seq, dp=dp, **given)
    check_expert_layout(job)
    if schedule != SOLVED_NAME:
        try:
            check_schedule_fits(schedule, placement=job.placement, v=job.v, with_csv=False)
        except ProblemError as err:
            raise ProblemError("schedule", err.message) from None
    if not job.layers and (schedule != SOLVED_NAME or not even_split(card.layers, job.stages)):
        job = job.with_layers(default_layers(card.layers, job.stages))
    return job_for_card(card, job)


def predict(
    *, model: str | Path | ModelCard, hardware: str | Path | HardwareCard, gpus: int,
    global_batch: int, seq: int, schedule: str = SOLVED_NAME, time_limit: float = 10.0,
    **fields: Any,
) -> Prediction:  # fmt: skip
    """Evaluate one fully pinned configuration, exactly as a plan evaluates its candidates.

    The analytic cost profile of the job, its schedule (solved, or PyTorch's by name), and
    the step time, throughput, MFU and peak memory that follow. A plan is the search over
    what this evaluates, so a prediction checked against a real run says how far to trust a
    plan.

    Parameters
    ----------
    model, hardware
        Card names (``pp-opt models`` lists the bundled ones), card paths, or loaded cards.
    gpus, global_batch, seq
        GPUs of the job, sequences per optimizer step, sequence length.
    schedule
        ``pp_opt`` (solved within ``time_limit`` seconds) or one of PyTorch's names
        (:func:`schedule_names`: ``1F1B``, ``Interleaved1F1B``, ``ZBVZeroBubble``, ...).
    time_limit
        Seconds for the ``pp_opt`` solve.
    **fields
        The configuration as :class:`~pp_opt.job.Job` fields (:data:`PREDICT_FIELDS`), each
        left out at the Job's default: the degrees ``tp``, ``pp``, ``cp``, ``dp_shard``,
        ``dp_replicate`` (their product must be ``gpus``; without ``dp_shard`` the ranks
        left go to FSDP, or to replicas on a stack without FSDP); ``mbs`` (the microbatches are
        ``global_batch / (dp * mbs)``); ``v`` and ``placement`` (None: what the schedule
        implies); ``layers`` (None: torchtitan's split for PyTorch's schedules, an even one
        for ``pp_opt`` where the stages divide the layers, else torchtitan's); ``ac`` and
        ``full_layers``; ``fp8``, ``compile``, ``async_tp``, ``fp8_all_gather``; the expert
        settings ``ep``, ``etp``, ``dispatcher``, ``expert_imbalance``; ``mtp``; the training
        ``stack``.

    Returns
    -------
    Prediction
        Step time (ms), tokens per second per GPU, MFU, peak memory per pipeline rank
        (bytes, as the stack reports it), and the schedule's status; a configuration that
        does not fit has no figures and a ``note`` saying why.

    Raises
    ------
    ProblemError
        For a bad argument, named with the fix (degrees that do not multiply to ``gpus``, a
        batch the microbatches do not divide, a schedule the placement cannot run, an expert
        layout the stack cannot run, a field predict does not take).
    """
    card_types = (str, Path)
    of_type("model", model, (*card_types, ModelCard), "a model card's name or path")
    of_type("hardware", hardware, (*card_types, HardwareCard), "a hardware card's name")
    for name, value in (("gpus", gpus), ("global_batch", global_batch), ("seq", seq)):
        integer(name, value, low=1)
    choice("schedule", schedule, schedule_names())
    number("time_limit", time_limit, above=0.0)
    card, hw = load_model_card(model), load_hardware_card(hardware)
    inputs = PlanInputs(model=card, hardware=hw, gpus=gpus, global_batch=global_batch, seq=seq)
    job = prediction_job(card, gpus=gpus, global_batch=global_batch, seq=seq, schedule=schedule,
                         **fields)  # fmt: skip
    candidate = Candidate(job=job, recompute=False, offload=False, origin="predict")
    order = SOLVED if schedule == SOLVED_NAME else schedule
    scored = evaluate(EvaluationTask(inputs=inputs, candidate=candidate, order=order,
                                     time_limit=time_limit))  # fmt: skip
    return Prediction.from_scored(scored, inputs)
