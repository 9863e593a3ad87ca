"""How a model's decoder layers are split into pipeline stages (every generic split rule)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pp_opt.errors import ProblemError
from pp_opt.job import Job
from pp_opt.profiler.cards import ModelCard
from pp_opt.profiler.moe import check_recompute_modules


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def suggest_split(total: int, stages: int) -> list[int]:
    """A balanced split that gives the end stages one layer less when that divides evenly.

    The end stages also run the embedding and the output layer; the Zero Bubble paper counts
    each as about one layer (22 layers on 8 stages: ``[2, 3, 3, 3, 3, 3, 3, 2]``).
    """
    if stages > 1 and (total + 2) % stages == 0 and (total + 2) // stages >= 2:
        per = (total + 2) // stages
        return [per - 1] + [per] * (stages - 2) + [per - 1]
    base, rest = divmod(total, stages)
    return [base + (1 if s < rest else 0) for s in range(stages)]


def split_layers(
    card: ModelCard, stages: int, layers: list[int] | tuple[int, ...] | None
) -> tuple[int, ...]:
    """Decoder layers per stage: an even split, or ``layers`` checked against the card."""
    if layers:
        split = tuple(int(n) for n in layers)
        if len(split) != stages:
            raise ProblemError(
                "layers", f"got {len(split)} entries for {stages} stages (pp x v); give one each"
            )
        if any(n < 0 for n in split) or sum(split) != card.layers:
            raise ProblemError(
                "layers",
                f"entries sum to {sum(split)}, the model has {card.layers} layers; "
                f"e.g. {suggest_split(card.layers, stages)}",
            )
        return split
    even = even_split(card.layers, stages)
    if even is None:
        options = _divisors(card.layers)
        raise ProblemError(
            "layers",
            f"{card.layers} layers do not split evenly into {stages} stages (pp x v); "
            f"use a stage count in {options} or give an uneven split, "
            f"e.g. layers={suggest_split(card.layers, stages)}",
        )
    return even


def even_split(total: int, stages: int) -> tuple[int, ...] | None:
    """The same layers on every stage; None when the stages do not divide them."""
    if stages < 1 or total % stages:
        return None
    return (total // stages,) * stages


def job_for_card(card: ModelCard, job: Job) -> Job:
    """``job`` checked against a model card, its layers split into stages (an even split
    unless the job gives one)."""
    if card.heads % job.tp or card.num_kv_heads % job.tp:
        ok = list(_divisors(card.num_kv_heads))
        raise ProblemError("tp", f"{job.tp} does not divide the heads; use one of {ok}")
    check_experts(card, job)
    check_recompute_modules(card, job)
    return job.with_layers(split_layers(card, job.stages, job.layers))


def check_experts(card: ModelCard, job: Job) -> None:
    """The job's expert parallelism fits the card: ``ep`` divides the routed experts, and a
    dense model has none."""
    if not card.moe:
        for name in ("ep", "etp"):
            if getattr(job, name) > 1:
                raise ProblemError(name, f"{card.name} is a dense model (no experts); use {name} 1")
        return
    if card.experts % job.ep:
        ok = [d for d in _divisors(card.experts) if (job.dp * job.cp * job.tp) % (d * job.etp) == 0]
        raise ProblemError(
            "ep", f"{job.ep} does not divide the {card.experts} experts of {card.name}; use one "
            f"of {ok}",
        )  # fmt: skip
    if card.moe_ffn % job.etp:
        raise ProblemError("etp", f"{job.etp} does not divide the expert width {card.moe_ffn}")


def stage_total(
    n: Any, layer: Sequence[Any], embedding: Sequence[Any], head: Sequence[Any], *,
    first: bool, last: bool,
) -> list[Any]:  # fmt: skip
    """A stage's costs from its ``n`` decoder layers: ``n x layer``, plus the embedding on
    the first stage and the output layer on the last (numbers or solver expressions alike)."""
    out = [n * x for x in layer]
    for extra, on in ((embedding, first), (head, last)):
        if on:
            out = [a + b for a, b in zip(out, extra, strict=True)]
    return out
