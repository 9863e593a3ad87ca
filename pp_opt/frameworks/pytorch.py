"""PyTorch's pipeline schedules by name: what each implies (checked against torch 2.13.0).

The names are the keys of ``torch.distributed.pipelining.schedules.get_schedule_class``.
torchtitan places stages on ranks by the name alone
(``_get_pp_rank_to_stage_indices_mapping``: V-style for ``ZBVZeroBubble`` and
``DualPipeV``, loop otherwise), also when it runs a schedule CSV, where the name only
says how to place the stages (the CSV runs on ``_PipelineScheduleRuntime``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pp_opt.errors import ProblemError


@dataclass(kw_only=True, slots=True, frozen=True)
class ScheduleName:
    """One name ``get_schedule_class`` takes."""

    name: str
    """PyTorch's name."""
    placement: str
    """``loop`` or ``v``: where torchtitan puts the stages for this name."""
    stages_per_rank: str
    """``one`` (a ``PipelineScheduleSingle``), ``two`` (the V schedules) or ``any``."""
    split_backward: bool
    """Runs ``I`` and ``W`` as separate actions (zero-bubble) rather than one ``B``."""
    runs_itself: bool
    """Has an order of its own (False: an abstract base, usable only with a CSV)."""


SCHEDULE_NAMES: dict[str, ScheduleName] = {
    s.name: s
    for s in (
        ScheduleName(name="GPipe", placement="loop", stages_per_rank="one",
                     split_backward=False, runs_itself=True),
        ScheduleName(name="1F1B", placement="loop", stages_per_rank="one",
                     split_backward=False, runs_itself=True),
        ScheduleName(name="Interleaved1F1B", placement="loop", stages_per_rank="any",
                     split_backward=False, runs_itself=True),
        ScheduleName(name="LoopedBFS", placement="loop", stages_per_rank="any",
                     split_backward=False, runs_itself=True),
        ScheduleName(name="InterleavedZeroBubble", placement="loop", stages_per_rank="any",
                     split_backward=True, runs_itself=True),
        ScheduleName(name="ZBVZeroBubble", placement="v", stages_per_rank="two",
                     split_backward=True, runs_itself=True),
        ScheduleName(name="DualPipeV", placement="v", stages_per_rank="two",
                     split_backward=True, runs_itself=True),
        ScheduleName(name="PipelineScheduleSingle", placement="loop", stages_per_rank="one",
                     split_backward=False, runs_itself=False),
        ScheduleName(name="PipelineScheduleMulti", placement="loop", stages_per_rank="any",
                     split_backward=False, runs_itself=False),
    )
}  # fmt: skip
"""Every name ``get_schedule_class`` of torch 2.13.0 takes."""

PYTORCH_SCHEDULES = tuple(s.name for s in SCHEDULE_NAMES.values() if s.runs_itself)
"""The schedules with an order of their own, in the order they are listed."""

INTERLEAVED_SCHEDULES = tuple(
    s.name
    for s in SCHEDULE_NAMES.values()
    if s.runs_itself and s.placement == "loop" and s.stages_per_rank == "any"
)
"""The looped schedules with an order of their own that run more than one stage per rank
(``Interleaved1F1B``, ``LoopedBFS``, ``InterleavedZeroBubble``)."""

V_SCHEDULES = tuple(s.name for s in SCHEDULE_NAMES.values() if s.placement == "v")
"""The schedules torchtitan places V-style (``ZBVZeroBubble``, ``DualPipeV``)."""

REFUSED_NAMES = {
    "_PipelineScheduleRuntime": "PipelineScheduleMulti (loop placement) or ZBVZeroBubble "
    "(v placement) with the CSV",
}
"""Names of PyTorch classes that ``get_schedule_class`` (and so torchtitan) refuses, with
the name to use instead."""


def schedule_name(name: str) -> ScheduleName:
    """The facts of ``name``; a one-line error naming the name to use otherwise."""
    if name in REFUSED_NAMES:
        raise ProblemError(
            "schedule_name", f"torchtitan refuses {name!r} (torch's get_schedule_class does not "
            f"know it); use {REFUSED_NAMES[name]}"
        )  # fmt: skip
    if name not in SCHEDULE_NAMES:
        raise ProblemError(
            "schedule_name", f"unknown {name!r}; use one of {', '.join(SCHEDULE_NAMES)}"
        )
    return SCHEDULE_NAMES[name]


def csv_schedule_name(*, placement: str, v: int) -> str:
    """The name that makes torchtitan place the stages as a pp_opt CSV expects."""
    if placement == "v":
        return "ZBVZeroBubble"
    return "PipelineScheduleSingle" if v == 1 else "PipelineScheduleMulti"


def check_schedule_fits(name: str, *, placement: str, v: int, with_csv: bool) -> ScheduleName:
    """``name``'s facts, when it fits ``placement`` and ``v`` (and runs with or without a CSV)."""
    facts = schedule_name(name)
    if facts.placement != placement:
        v_names = " and ".join(V_SCHEDULES)
        fit = " or ".join(V_SCHEDULES) if placement == "v" else "a loop schedule"
        raise ProblemError(
            "schedule_name", f"torchtitan places stages V-style only for {v_names}; {name!r} "
            f"does not fit placement {placement!r}: use {fit}, or placement {facts.placement!r}"
        )  # fmt: skip
    if facts.stages_per_rank == "one" and v != 1:
        raise ProblemError(
            "schedule_name", f"{name} runs one stage per device, not v = {v}; use "
            + ("PipelineScheduleMulti" if with_csv else " or ".join(INTERLEAVED_SCHEDULES))
        )  # fmt: skip
    if not facts.runs_itself and not with_csv:
        raise ProblemError(
            "schedule_name", f"{name} is an abstract base: it runs only a schedule CSV; "
            "give the CSV or a schedule of PyTorch's own (1F1B, Interleaved1F1B, ...)"
        )  # fmt: skip
    return facts
