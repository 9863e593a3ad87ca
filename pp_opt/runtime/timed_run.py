"""Timed training steps of a decoder model on a pp_opt schedule, to set against its prediction.

Every rank of a process group (``torchrun``, or the processes the fidelity benchmark starts)
builds the stages the schedule places on it (:func:`build_decoder_pipeline`, the same
modules the measured profiler timed), then :func:`time_steps` runs training steps:
all ranks meet at a barrier, each times its own ``pipe.step`` (the pipeline: forward,
backward, sends and receives, gradient scaling) and then, separately, its optimizer step.
:func:`gather_step_times` collects every rank's times; a step's iteration time is the
slowest rank's pipeline time, which is what the schedule's ``makespan`` predicts (a
synchronous optimizer step follows it and is reported on its own). Warm-up steps are
timed but left out of the summary.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage

from pp_opt.errors import ProblemError
from pp_opt.profiler.cards import ModelCard
from pp_opt.profiler.torch.model import DecoderStage, lm_loss, make_stage
from pp_opt.profiler.torch.timing_stats import timing_stats
from pp_opt.runtime.torch_schedule import PPOptPipelineSchedule, build_pipeline_schedule
from pp_opt.schedule import Schedule

logger = logging.getLogger(__name__)


def stage_layers(schedule: Schedule, layers: Sequence[int] | None = None) -> list[int]:
    """Decoder layers per stage: ``layers``, else those of the profile the schedule came from."""
    if layers is None:
        profile = schedule.problem.extra.get("profile") or {}
        layers = (profile.get("layout") or {}).get("layers")
    if not layers:
        raise ProblemError(
            "layers", "the schedule carries no profile layout; give the layers per stage"
        )
    if len(layers) != schedule.problem.num_stages:
        raise ProblemError(
            "layers",
            f"got {len(layers)} entries for the schedule's {schedule.problem.num_stages} "
            "stages; give one per stage",
        )
    return list(layers)


def build_decoder_pipeline(
    schedule: Schedule,
    card: ModelCard,
    *,
    rank: int,
    device: torch.device,
    layers: Sequence[int] | None = None,
    dtype: str = "fp32",
    seed: int = 0,
    format: str = "compute_only",
) -> tuple[PPOptPipelineSchedule, list[DecoderStage]]:
    """This rank's decoder stages and the pipeline schedule object that runs ``schedule``."""
    split = stage_layers(schedule, layers)
    problem = schedule.problem
    mine = problem.stages_on(rank)
    modules = [make_stage(card, split, s, device=device, dtype=dtype, seed=seed) for s in mine]
    stages = [
        PipelineStage(module, s, problem.num_stages, device)
        for s, module in zip(mine, modules, strict=True)
    ]
    pipe = build_pipeline_schedule(schedule, stages, loss_fn=lm_loss, format=format)
    return pipe, modules


@dataclass(kw_only=True, slots=True)
class StepTimes:
    """One rank's times of each step (ms): the pipeline step and the optimizer step."""

    rank: int
    pipeline: list[float] = field(default_factory=list)
    optimizer: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


def time_steps(
    pipe: PPOptPipelineSchedule,
    modules: Sequence[torch.nn.Module],
    batch: tuple[torch.Tensor, torch.Tensor],
    *,
    steps: int,
    optimizer: torch.optim.Optimizer | None = None,
    times: StepTimes | None = None,
) -> StepTimes:
    """Run ``steps`` training steps on every rank (all ranks call it); return this rank's times.

    Each step starts at a barrier so that ranks start together; gradients are zeroed before
    it, outside the timed region, as a training loop does after its optimizer step.
    """
    device = next(modules[0].parameters()).device if modules else torch.device("cpu")
    times = times or StepTimes(rank=dist.get_rank())
    ids, targets = batch
    for _ in range(steps):
        for module in modules:
            module.zero_grad(set_to_none=True)
        losses: list[torch.Tensor] = []
        _sync(device)
        dist.barrier()
        start = time.perf_counter()
        pipe.step(ids, target=targets, losses=losses, return_outputs=False)
        _sync(device)
        mid = time.perf_counter()
        if optimizer is not None:
            optimizer.step()
            _sync(device)
        end = time.perf_counter()
        times.pipeline.append(1e3 * (mid - start))
        times.optimizer.append(1e3 * (end - mid))
        if losses:
            times.losses.append(float(torch.stack([v.detach() for v in losses]).mean()))
    return times


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gather_step_times(times: StepTimes) -> list[StepTimes]:
    """Every rank's :class:`StepTimes`, on every rank, in rank order."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, times)
    return sorted(gathered, key=lambda t: t.rank)


def summarize(all_ranks: Sequence[StepTimes], *, warmup: int) -> dict[str, Any]:
    """Iteration times (slowest rank per step) and per-rank times, warm-up steps left out.

    Returns ``iteration`` (median, iqr, ... over the timed steps), ``per_step`` (iteration
    time of every timed step), ``ranks`` (per rank: pipeline and optimizer medians) and
    ``losses`` (the last stage's mean loss per step, warm-up included).
    """
    steps = min(len(t.pipeline) for t in all_ranks)
    if steps <= warmup:
        raise ProblemError("steps", f"{steps} steps leave none after {warmup} warm-up steps")
    per_step = [max(t.pipeline[i] for t in all_ranks) for i in range(warmup, steps)]
    ranks = [
        {"rank": t.rank, "pipeline": timing_stats(t.pipeline[warmup:]),
         "optimizer": timing_stats(t.optimizer[warmup:])}
        for t in all_ranks
    ]  # fmt: skip
    losses = next((t.losses for t in all_ranks if t.losses), [])
    return {"iteration": timing_stats(per_step), "per_step": per_step, "ranks": ranks,
            "losses": losses, "warmup": warmup}  # fmt: skip


class ActionTimer:
    """Times every compute action the runtime runs on this rank's stages (ms, per op kind).

    Wraps the ``PipelineStage`` methods the runtime calls: ``forward_one_chunk`` (F, plus the
    runtime's ``_maybe_compute_loss`` that follows it on the last stage),
    ``backward_one_chunk`` (``I`` or the fused ``B``) and ``backward_weight_one_chunk`` (W).
    Keys are pp_opt op kinds:
    ``F``, ``B`` (PyTorch's I), ``W`` and ``BW`` (PyTorch's B), per stage. On CUDA the times
    are host-side launch times unless the device is synchronised; use them on CPU.
    """

    def __init__(self) -> None:
        self.samples: dict[tuple[str, int], list[float]] = {}
        self.enabled = True

    def install(self, pipe: PPOptPipelineSchedule) -> ActionTimer:
        for stage in pipe._stages:
            self._wrap(stage, "forward_one_chunk", lambda kw: "F")
            self._wrap(stage, "backward_one_chunk",
                       lambda kw: "BW" if kw.get("full_backward", True) else "B")  # fmt: skip
            self._wrap(stage, "backward_weight_one_chunk", lambda kw: "W")
        loss = pipe._maybe_compute_loss

        def timed_loss(stage: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = loss(stage, *args, **kwargs)  # type: ignore[no-untyped-call]
            if self.enabled and stage.is_last:
                key = ("loss", stage.stage_index)
                self.samples.setdefault(key, []).append(1e3 * (time.perf_counter() - start))
            return out

        pipe._maybe_compute_loss = timed_loss  # type: ignore[method-assign]
        return self

    def _wrap(self, stage: Any, method: str, kind_of: Any) -> None:
        original = getattr(stage, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.enabled:
                return original(*args, **kwargs)
            start = time.perf_counter()
            out = original(*args, **kwargs)
            key = (kind_of(kwargs), stage.stage_index)
            self.samples.setdefault(key, []).append(1e3 * (time.perf_counter() - start))
            return out

        setattr(stage, method, timed)

    def medians(self) -> dict[str, float]:
        """``"{kind}{stage}" -> median ms``, e.g. ``"W0"`` (the loss counted in its F)."""
        out = {f"{k}{s}": statistics.median(v) for (k, s), v in sorted(self.samples.items())}
        for (kind, s), samples in self.samples.items():
            if kind == "loss":
                del out[f"loss{s}"]
                if f"F{s}" in out:
                    out[f"F{s}"] += statistics.median(samples)
        return out


def compare_schedules(
    schedules: dict[str, Schedule],
    card: ModelCard,
    batch: tuple[torch.Tensor, torch.Tensor],
    *,
    rank: int,
    device: torch.device,
    rounds: int,
    steps: int,
    warmup: int,
    dtype: str = "fp32",
    seed: int = 0,
    profile_repeats: int = 0,
) -> tuple[dict[str, dict[str, Any]], list[dict[str, float]]]:
    """Time several schedules of one model in interleaved rounds (every rank calls it).

    Each schedule gets ``warmup`` untimed-in-summary steps first, then ``rounds`` rounds of
    ``steps`` steps, the schedules taking turns within a round (rotated each round), so slow
    drifts of the machine's load hit them alike. With ``profile_repeats``, each round starts
    with a profile of every stage (all ranks at once, :func:`round_profile`), so predictions
    can be made with the costs of the same minutes as the measurement.

    Returns per schedule :func:`summarize` plus ``per_round`` (the median iteration time of
    each round) and ``actions`` (median time of each op kind and stage as the runtime ran it,
    :class:`ActionTimer`); and the per-round profiles (empty without ``profile_repeats``).
    """
    pipes = {
        name: build_decoder_pipeline(
            schedule, card, rank=rank, device=device, dtype=dtype, seed=seed
        )  # fmt: skip
        for name, schedule in schedules.items()
    }
    times = {name: StepTimes(rank=rank) for name in schedules}
    timers = {name: ActionTimer() for name in schedules}
    for name, (pipe, modules) in pipes.items():
        timers[name].enabled = False
        timers[name].install(pipe)
        time_steps(pipe, modules, batch, steps=warmup, times=times[name])
        timers[name].enabled = True
    names = list(schedules)
    first = next(iter(schedules.values()))
    profiles = []
    for r in range(rounds):
        if profile_repeats:
            key = f"pp_opt.round{r}"
            profiles.append(round_profile(first, card, rank=rank, device=device, dtype=dtype,
                                          repeats=profile_repeats, key=key))  # fmt: skip
        for name in names[r % len(names) :] + names[: r % len(names)]:
            pipe, modules = pipes[name]
            time_steps(pipe, modules, batch, steps=steps, times=times[name])
    out = {}
    for name in names:
        summary = summarize(gather_step_times(times[name]), warmup=warmup)
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, timers[name].medians())
        summary["actions"] = {k: v for medians in gathered for k, v in medians.items()}
        per_step = summary["per_step"]
        summary["per_round"] = [
            statistics.median(per_step[r * steps : (r + 1) * steps]) for r in range(rounds)
        ]
        out[name] = summary
    return out, profiles


def round_profile(
    schedule: Schedule,
    card: ModelCard,
    *,
    rank: int,
    device: torch.device,
    dtype: str,
    repeats: int,
    key: str,
) -> dict[str, float]:
    """Profile this rank's stages while every other rank profiles its own; gathered.

    Returns ``"{kind}{stage}" -> median ms`` (``F``, ``B`` for I, ``W``, ``BW`` for the fused B)
    for every stage, the keys :func:`pp_opt.runtime.plans.with_measured_times` takes.
    """
    from pp_opt.profiler.torch.stage_profile import GroupPeers, measure_stages

    layout = (schedule.problem.extra.get("profile") or {}).get("layout") or {}
    meas = measure_stages(
        card, stage_layers(schedule), schedule.problem.stages_on(rank),
        mbs=layout.get("mbs", 1), seq=layout.get("seq", card.seq), device=device, dtype=dtype,
        repeats=repeats, warmup=2, peers=GroupPeers(key),
    )  # fmt: skip
    mine = {f"{kind}{s}": m[op]["median"] for s, m in meas.items()
            for kind, op in (("F", "f"), ("B", "i"), ("W", "w"), ("BW", "b"))}  # fmt: skip
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return {k: v for part in gathered for k, v in part.items()}
