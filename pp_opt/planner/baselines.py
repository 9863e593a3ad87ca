"""What a user would pick instead: torchtitan's and Megatron-LM's defaults, as candidates.

- torchtitan splits the decoder layers counting the embedding and the output layer as one
  layer each, and gives the remainder to the first stages (``8, 9, 8, 7`` for 32 layers on
  4 stages); its schedule is ``1F1B`` for one chunk per device, ``Interleaved1F1B`` for more.
- Megatron-LM splits evenly (it needs the layers to divide) and runs interleaved 1F1B.

Each is evaluated twice on the same costs: with its own order and with pp_opt's solved
order, so that the gain of the split and the gain of the order show apart.
"""

from __future__ import annotations

from dataclasses import replace

from pp_opt.export.training_config import torchtitan_default_layers
from pp_opt.job import Job
from pp_opt.planner.config import Candidate
from pp_opt.problem import Problem
from pp_opt.profiler import layer_split
from pp_opt.schedule import Schedule


def torchtitan_split(layers: int, stages: int) -> tuple[int, ...]:
    """torchtitan's default split, as a tuple (:mod:`pp_opt.export.training_config`)."""
    return tuple(torchtitan_default_layers(layers, stages))


def even_split(layers: int, stages: int) -> tuple[int, ...] | None:
    """Megatron-LM's even split, None when the stages do not divide the layers."""
    return layer_split.even_split(layers, stages)


def pytorch_schedule(v: int) -> str:
    """torchtitan's default schedule for ``v`` chunks per device."""
    return "1F1B" if v == 1 else "Interleaved1F1B"


def run_baseline(name: str, problem: Problem) -> Schedule:
    """PyTorch-named schedule ``name`` on ``problem`` (validated by :func:`pp_opt.baseline`)."""
    from pp_opt.orders import baseline

    return baseline(name, problem)


INTERLEAVED_V = 2
"""Chunks per device of the interleaved defaults (the common choice, and the least that
interleaves)."""


def baseline_candidates(best: Candidate, layers: int) -> list[tuple[str, str, Candidate]]:
    """``(label, schedule, candidate)`` of the defaults for the best candidate's degrees.

    Same ``tp``, ``pp``, ``dp``, ``mbs`` and optimizer sharding as the best; recompute and
    offload off. torchtitan: one chunk per device with 1F1B, and :data:`INTERLEAVED_V` chunks
    (``loop``) with Interleaved1F1B; Megatron-LM: :data:`INTERLEAVED_V` chunks with an even
    split (when it divides) and interleaved 1F1B. Fixed chunk counts keep the defaults what a
    user would pick without a planner.
    """
    plain = best.job
    out: list[tuple[str, str, Candidate]] = []
    one = replace(plain, v=1, placement="loop", layers=())
    out.append(("torchtitan", "1F1B", _candidate(one, torchtitan_split(layers, one.stages))))
    looped = replace(plain, v=INTERLEAVED_V, placement="loop", layers=())
    if plain.pp > 1 and looped.stages <= layers:
        split = torchtitan_split(layers, looped.stages)
        out.append(("torchtitan", "Interleaved1F1B", _candidate(looped, split)))
        even = even_split(layers, looped.stages)
        if even is not None:
            out.append(("megatron", "Interleaved1F1B", _candidate(looped, even)))
    return out


def _candidate(job: Job, layers: tuple[int, ...]) -> Candidate:
    return Candidate(job=job.with_layers(layers), recompute=False, offload=False, origin="baseline")
