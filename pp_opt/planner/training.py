"""Settings a training job can paste for a plan: torchtitan's fields and flags
(:mod:`pp_opt.export.torchtitan`) and Megatron-LM's flags
(:mod:`pp_opt.export.training_config`), next to the torch-csv of the schedule.

:func:`plan_training` makes the choices a plan's best candidate leaves open for torchtitan:
its CSV has no offload, reload or recompute action, so a best plan that offloads or
recomputes is named with the best plan without them, whose settings follow; and an
activation checkpointing mode that cannot run a split backward gets the fused-backward
CSV, re-timed to say what it costs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from pp_opt.errors import ProblemError
from pp_opt.export.torchtitan import (
    data_parallel_keys,
    expert_keys,
    torchtitan_flags,
    torchtitan_settings,
)
from pp_opt.export.training_config import MEGATRON_FSDP_ENV, megatron_flags
from pp_opt.frameworks import torchtitan as titan
from pp_opt.job import Job
from pp_opt.ops import OpKind
from pp_opt.planner.evaluate import Scored
from pp_opt.planner.result import Plan
from pp_opt.schedule import Schedule

log = logging.getLogger(__name__)


DEFAULT_CSV = "schedule.csv"
"""The CSV the settings name when the plan wrote none (``--torch-csv`` not given)."""


def training_settings(
    best: Scored,
    *,
    n_layers: int,
    schedule_csv: str | None = None,
    split_backward: bool = False,
    activation_checkpoint: str | None = None,
    torchtitan: str = titan.DEFAULT_RELEASE,
) -> dict[str, Any]:
    """torchtitan fields and flags and Megatron-LM flags of ``best``'s job (a note instead
    of the Megatron-LM flags where it cannot express the configuration, e.g. the V
    placement); ``activation_checkpoint``: the mode torchtitan is told instead of the
    job's own."""
    job = best.candidate.job
    if activation_checkpoint is not None:
        job = replace(job, ac=activation_checkpoint)
    out: dict[str, Any] = {"layers": list(job.layers)}
    if job.pp > 1:
        if schedule_csv is None:  # the keys still name the CSV a job needs; say how to make it
            schedule_csv = DEFAULT_CSV
            out["schedule_csv_note"] = (
                f"write {DEFAULT_CSV} with: pp-opt export best.json --format torch-csv -o "
                f"{DEFAULT_CSV}" + (" --fused-backward" if not split_backward else "")
            )  # fmt: skip
        out["schedule_csv"] = schedule_csv
    settings = torchtitan_settings(
        job, schedule_csv=schedule_csv if job.pp > 1 else None, n_layers=n_layers,
        split_backward=split_backward, version=torchtitan,
    )  # fmt: skip
    out["torchtitan"] = {**settings, "flags": torchtitan_flags(settings)}
    try:
        out["megatron"] = megatron_flags(job, n_layers=n_layers, recompute=best.candidate.recompute)
        if "--use-megatron-fsdp" in out["megatron"]:
            out["megatron_env"] = MEGATRON_FSDP_ENV
    except ProblemError as err:  # Megatron-LM has no V placement
        out["megatron_note"] = str(err)
    return out


@dataclass(kw_only=True, slots=True, frozen=True)
class TorchtitanChoice:
    """What a plan gives torchtitan: the candidate, its schedule and how to export it."""

    scored: Scored | None
    """The best candidate torchtitan can run (None: none can)."""
    schedule: Schedule | None
    """Its schedule (split backward as solved)."""
    fused_backward: bool
    """Export its CSV with ``--fused-backward``."""
    settings: dict[str, Any]
    """The training settings (``Plan.training``)."""


def _unrunnable(schedule: Schedule) -> str:
    """Why torchtitan cannot run ``schedule`` ('' when it can)."""
    offloads = sum(op.kind is OpKind.OFFLOAD for op in schedule.ops)
    recomputes = sum(op.kind is OpKind.R for op in schedule.ops)
    parts = [f"offloads {offloads} activations"] * bool(offloads)
    parts += [f"recomputes {recomputes} forwards"] * bool(recomputes)
    return " and ".join(parts)


def plan_training(
    plan: Plan,
    *,
    schedule_csv: str | None = None,
    activation_checkpoint: str | None = None,
    torchtitan: str = titan.DEFAULT_RELEASE,
) -> TorchtitanChoice:
    """The settings of the best candidate torchtitan can run, with notes on the choices.

    ``activation_checkpoint``: torchtitan's mode; None: the one that runs the chosen
    candidate's own (``Job.ac``, whose recompute its costs include)."""
    from pp_opt.schedule_io import schedule_from_dict

    titan.release(torchtitan)
    if activation_checkpoint is not None:
        titan.activation_checkpoint(activation_checkpoint)
    best = plan.best
    if best is None:
        return TorchtitanChoice(scored=None, schedule=None, fused_backward=False, settings={})
    notes: list[str] = []
    chosen: Scored | None = None
    schedule: Schedule | None = None
    for scored in plan.candidates:
        if scored.schedule is None:
            continue
        candidate_schedule = schedule_from_dict(scored.schedule)
        refusal = _torchtitan_refusal(scored.candidate.job)
        why = _unrunnable(candidate_schedule)
        if not why and not refusal:
            chosen, schedule = scored, candidate_schedule
            break
        if scored is best and refusal:
            notes.append(f"torchtitan {torchtitan} cannot run the best plan "
                         f"({best.candidate.label()}): {refusal}")  # fmt: skip
        elif scored is best:
            notes.append(
                f"the best plan ({best.candidate.label()}, {best.step_time:.1f} ms) "
                f"{why}: torchtitan's CSV has no offload, reload or recompute action, so its "
                "schedule is for pp_opt's own runtime (pp_opt.runtime; --schedule writes it)"
            )  # fmt: skip
    if chosen is None or schedule is None:
        notes.append(f"torchtitan {torchtitan} runs no ranked plan: no torchtitan settings")
        return TorchtitanChoice(scored=None, schedule=None, fused_backward=False,
                                settings={"notes": notes})  # fmt: skip
    if chosen is not best:
        extra = (chosen.step_time or 0.0) - (best.step_time or 0.0)
        notes.append(
            f"the best plan torchtitan {torchtitan} runs: {chosen.candidate.label()}, "
            f"{chosen.step_time:.1f} ms (+{extra:.1f} ms); the torchtitan settings are for it"
        )  # fmt: skip
    modelled = titan.job_mode(chosen.candidate.job.ac)
    if activation_checkpoint is None:
        activation_checkpoint = modelled
    elif activation_checkpoint != modelled:
        notes.append(
            f"the plan's costs are for {modelled} activation checkpointing (--ac), torchtitan "
            f"is told {activation_checkpoint}: its memory and recompute differ from them"
        )  # fmt: skip
    _, splits = titan.activation_checkpoint(activation_checkpoint)
    split = any(op.kind is OpKind.W for op in schedule.ops)
    fused = split and not splits
    fused_info: dict[str, Any] = {}
    if fused:
        fused_info = _fused_note(chosen, schedule, activation_checkpoint, notes)
    settings = training_settings(
        chosen, n_layers=plan.inputs.model.layers, schedule_csv=schedule_csv,
        split_backward=split and not fused, activation_checkpoint=activation_checkpoint,
        torchtitan=torchtitan,
    )  # fmt: skip
    settings["candidate"] = chosen.candidate.label()
    settings["backward"] = "fused" if fused else "split" if split else "fused (as solved)"
    if fused_info:
        settings["fused_backward"] = fused_info
    notes += _stack_notes(chosen.candidate.job)
    if notes:
        settings["notes"] = notes
    return TorchtitanChoice(scored=chosen, schedule=schedule, fused_backward=fused,
                            settings=settings)  # fmt: skip


def _stack_notes(job: Job) -> list[str]:
    """What the job's stack does not do that the plan allowed (its card's note): a release
    that runs an overlapped pair's halves in sequence gains nothing from pairs."""
    from pp_opt.profiler.stacks import load_stack_card

    stack = load_stack_card(job.stack)
    if job.overlap and not stack.overlaps_pairs and stack.note:
        return [f"{stack.name}: {stack.note}; its pairs hide nothing in these costs"]
    return []


def _torchtitan_refusal(job: Job) -> str:
    """Why torchtitan cannot run ``job``'s layout ("" when it can): it shards the optimizer
    only with FSDP; its expert parallelism borrows only ``dp_shard x cp x tp`` ranks and has
    no expert TP; Megatron-Core's module checkpointing is not one of its modes."""
    try:
        data_parallel_keys(job)
        expert_keys(job)
        titan.job_mode(job.ac)
    except ProblemError as err:
        return f"{err.field}: {err.message}"
    return ""


def _fused_note(chosen: Scored, schedule: Schedule, mode: str, notes: list[str]) -> dict[str, Any]:
    """Re-time the fused order; say why it was chosen and what it costs."""
    from pp_opt.export.fused import fused_backward_schedule

    cost = fused_backward_schedule(schedule)
    step = chosen.step_time or 0.0
    fused_step = step + cost.added
    text = (
        f"{mode} activation checkpointing cannot run a split backward (I then W), so the CSV "
        f"fuses each I and its W into one B at the I's place (--fused-backward): predicted "
        f"step {fused_step:.1f} ms against {step:.1f} ms split (+{cost.added:.1f} ms, "
        f"+{cost.added / step if step else 0.0:.1%})"
    )  # fmt: skip
    if cost.violations:
        text += f"; the fused order breaks {len(cost.violations)} rule(s): {cost.violations[0]}"
    notes.append(text)
    return {"step_time": fused_step, "split_step_time": step, "added_ms": cost.added,
            "violations": list(cost.violations)}  # fmt: skip
