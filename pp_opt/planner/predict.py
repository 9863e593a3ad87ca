"""Predict one fully pinned configuration: its step time, throughput and peak memory.

``pp-opt predict`` and :func:`predict` evaluate exactly what a plan's candidates are
evaluated with (:func:`pp_opt.planner.evaluate.evaluate`: the analytic profile, the
schedule, the step time), so a plan is a search over predictions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pp_opt.arguments import choice, flag, integer, number, of_type
from pp_opt.errors import ProblemError
from pp_opt.frameworks.pytorch import PYTORCH_SCHEDULES, check_schedule_fits
from pp_opt.frameworks.torchtitan import default_layers, default_stages_per_rank
from pp_opt.job import Job, microbatch_count
from pp_opt.planner.config import Candidate, PlanInputs
from pp_opt.planner.evaluate import SOLVED, EvaluationTask, Scored, evaluate
from pp_opt.profiler.cards import HardwareCard, ModelCard, load_hardware_card, load_model_card
from pp_opt.profiler.layer_split import job_for_card

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
    """Per pipeline rank: the peak as a framework reports it (reserved bytes)."""
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

    def to_dict(self) -> dict[str, Any]:
        """The prediction file (``"format": "pp-opt.prediction"``)."""
        return {
            "format": FORMAT, "version": VERSION, "config": self.config,
            "schedule": self.schedule, "step_time": self.step_time,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "mfu": self.mfu,
            "peak_memory": self.peak_memory, "status": self.status, "gap": self.gap,
            "iteration_makespan": self.iteration_makespan, "dp_sync": self.dp_sync,
            "optimizer_step": self.optimizer_step, "note": self.note,
        }  # fmt: skip

    @classmethod
    def from_scored(cls, scored: Scored, inputs: PlanInputs) -> Prediction:
        """The prediction of one evaluated candidate."""
        job = scored.candidate.job
        config = {**inputs.to_dict(), **job.layout_dict(0.0), "dp": job.dp,
                  "dp_shard": job.dp_shard, "dp_replicate": job.dp_replicate, "cp": job.cp,
                  "ac": job.activation_checkpoint, "fp8": job.fp8, "compile": job.compile,
                  "async_tp": job.async_tp, "fp8_all_gather": job.fp8_all_gather}  # fmt: skip
        config.pop("bytes_per_param", None)
        config.pop("recompute", None)
        return cls(
            config=config, schedule=SOLVED_NAME if scored.order == SOLVED else scored.order,
            step_time=scored.step_time, tokens_per_s_per_gpu=scored.tokens_per_s_per_gpu,
            mfu=scored.mfu, peak_memory=list(scored.peak_memory), status=scored.status,
            gap=scored.gap, iteration_makespan=scored.iteration_makespan,
            dp_sync=scored.dp_sync, optimizer_step=scored.optimizer_step, note=scored.note,
        )  # fmt: skip


def schedule_names() -> tuple[str, ...]:
    """``pp_opt`` and PyTorch's schedule names."""
    return (SOLVED_NAME, *PYTORCH_SCHEDULES)


def prediction_job(
    card: ModelCard, *, gpus: int, global_batch: int, seq: int, tp: int, pp: int, cp: int,
    dp_shard: int, dp_replicate: int, mbs: int, schedule: str, v: int | None, placement: str,
    layers: tuple[int, ...] | None, ac: str, fp8: bool, compile: bool, async_tp: bool,
    fp8_all_gather: bool | None, full_layers: tuple[int, ...] = (),
) -> Job:  # fmt: skip
    """The pinned job: degrees checked against ``gpus``, microbatches from the batch; for a
    PyTorch schedule, ``v`` as torchtitan builds it, checked to fit the schedule, and layers
    split as torchtitan splits them (evenly for ``pp_opt``)."""
    product = tp * pp * cp * dp_shard * dp_replicate
    if product != gpus:
        raise ProblemError(
            "gpus", f"{gpus} GPUs but tp x pp x cp x dp_shard x dp_replicate = {product}; "
            "give degrees whose product is the GPU count",
        )  # fmt: skip
    dp = dp_shard * dp_replicate
    microbatches = microbatch_count(global_batch=global_batch, dp=dp, mbs=mbs)
    if v is None:  # the v placement lifts it to 2 (Job)
        v = 1 if schedule == SOLVED_NAME else default_stages_per_rank(schedule)
    job = Job(
        pp=pp, v=v, placement=placement, microbatches=microbatches, mbs=mbs,
        seq=seq, tp=tp, dp=dp, dp_shard=dp_shard, dp_replicate=dp_replicate, cp=cp,
        activation_checkpoint=ac, fp8=fp8, compile=compile, async_tp=async_tp,
        fp8_all_gather=fp8_all_gather,
        layers=tuple(layers or ()), full_layers=tuple(full_layers),
    )  # fmt: skip
    if schedule != SOLVED_NAME:
        try:
            check_schedule_fits(schedule, placement=job.placement, v=job.v, with_csv=False)
        except ProblemError as err:
            raise ProblemError("schedule", err.message) from None
        if not job.layers:
            job = job.with_layers(default_layers(card.layers, job.stages))
    return job_for_card(card, job)


def predict(
    *, model: str | Path | ModelCard, hardware: str | Path | HardwareCard, gpus: int,
    global_batch: int, seq: int, tp: int = 1, pp: int = 1, cp: int = 1, dp_shard: int = 1,
    dp_replicate: int = 1, mbs: int = 1, schedule: str = SOLVED_NAME, v: int | None = None,
    placement: str = "loop", layers: tuple[int, ...] | list[int] | None = None,
    ac: str = "none", fp8: bool = False, compile: bool = False, async_tp: bool = False,
    fp8_all_gather: bool | None = None, full_layers: tuple[int, ...] = (),
    time_limit: float = 10.0,
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
    tp, pp, cp, dp_shard, dp_replicate
        Tensor, pipeline, context and data-parallel degrees (FSDP shards over ``dp_shard``,
        replicates over ``dp_replicate``); their product must be ``gpus``.
    mbs
        Sequences per microbatch; the microbatches are ``global_batch / (dp * mbs)``.
    schedule
        ``pp_opt`` (solved within ``time_limit`` seconds) or one of PyTorch's names
        (:func:`schedule_names`: ``1F1B``, ``Interleaved1F1B``, ``ZBVZeroBubble``, ...).
    v, placement
        Chunks per device and ``loop`` or ``v``; None: what the schedule implies.
    layers
        Decoder layers per stage; None: torchtitan's split for PyTorch's schedules, an even
        one for ``pp_opt``.
    ac, full_layers
        Activation checkpointing (``none``, ``selective``, ``selective_op``, ``full``), and
        fully checkpointed layers per stage.
    fp8, compile, async_tp, fp8_all_gather
        Float8 linear layers, torch.compile, AsyncTP, and Float8 FSDP all-gathers (None: on
        with Float8 and FSDP).
    time_limit
        Seconds for the ``pp_opt`` solve.

    Returns
    -------
    Prediction
        Step time (ms), tokens per second per GPU, MFU, peak memory per pipeline rank
        (bytes), and the schedule's status; a configuration that does not fit has no
        figures and a ``note`` saying why.

    Raises
    ------
    ProblemError
        For a bad argument, named with the fix (degrees that do not multiply to ``gpus``, a
        batch the microbatches do not divide, a schedule the placement cannot run).
    """
    _check_arguments(dict(
        model=model, hardware=hardware, gpus=gpus, global_batch=global_batch, seq=seq, tp=tp,
        pp=pp, cp=cp, dp_shard=dp_shard, dp_replicate=dp_replicate, mbs=mbs, schedule=schedule,
        v=v, placement=placement, layers=layers, ac=ac, fp8=fp8, compile=compile,
        async_tp=async_tp, fp8_all_gather=fp8_all_gather, full_layers=full_layers,
        time_limit=time_limit,
    ))  # fmt: skip
    card, hw = load_model_card(model), load_hardware_card(hardware)
    inputs = PlanInputs(model=card, hardware=hw, gpus=gpus, global_batch=global_batch, seq=seq)
    job = prediction_job(
        card, gpus=gpus, global_batch=global_batch, seq=seq, tp=tp, pp=pp, cp=cp,
        dp_shard=dp_shard, dp_replicate=dp_replicate, mbs=mbs, schedule=schedule, v=v,
        placement=placement, layers=None if layers is None else tuple(layers), ac=ac, fp8=fp8,
        compile=compile, async_tp=async_tp, fp8_all_gather=fp8_all_gather,
        full_layers=tuple(full_layers),
    )  # fmt: skip
    candidate = Candidate(job=job, recompute=False, offload=False, origin="predict")
    order = SOLVED if schedule == SOLVED_NAME else schedule
    scored = evaluate(EvaluationTask(inputs=inputs, candidate=candidate, order=order,
                                     time_limit=time_limit))  # fmt: skip
    return Prediction.from_scored(scored, inputs)


def _check_arguments(args: dict[str, Any]) -> None:
    """Each of :func:`predict`'s arguments checked by name, before any work starts."""
    card_types = (str, Path)
    of_type("model", args["model"], (*card_types, ModelCard), "a model card's name or path")
    of_type("hardware", args["hardware"], (*card_types, HardwareCard), "a hardware card's name")
    for name in ("gpus", "global_batch", "seq", "tp", "pp", "cp", "dp_shard", "dp_replicate",
                 "mbs"):  # fmt: skip
        integer(name, args[name], low=1)
    choice("schedule", args["schedule"], schedule_names())
    if args["v"] is not None:
        integer("v", args["v"], low=1)
    choice("placement", args["placement"], ("loop", "v"))
    for name in ("layers", "full_layers"):
        value = args[name]
        if (value is not None or name == "full_layers") and (
            isinstance(value, str | bytes) or not isinstance(value, tuple | list)
        ):
            raise ProblemError(name, f"got {value!r:.60}; give a list of layer counts per stage")
    of_type("ac", args["ac"], str, "none, selective, selective_op or full")
    for name in ("fp8", "compile", "async_tp"):
        flag(name, args[name])
    if args["fp8_all_gather"] is not None:
        flag("fp8_all_gather", args["fp8_all_gather"])
    number("time_limit", args["time_limit"], above=0.0)
