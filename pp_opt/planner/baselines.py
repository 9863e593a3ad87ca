"""What a user would pick instead: torchtitan's and Megatron-LM's defaults, as candidates.

- torchtitan splits the decoder layers counting the embedding and the output layer as one
  layer each, and gives the remainder to the first stages (``8, 9, 8, 7`` for 32 layers on
  4 stages); its schedule is ``1F1B`` for one chunk per device, ``Interleaved1F1B`` with
  two chunks for more; it runs FSDP over every data-parallel rank
  (``data_parallel_shard_degree = -1``), the model config's activation checkpointing (full
  for Llama 3 70B and 405B) and microbatches of one sequence under a pipeline
  (:mod:`pp_opt.frameworks.torchtitan`).
- Megatron-LM splits evenly (it needs the layers to divide) and runs interleaved 1F1B
  (:mod:`pp_opt.frameworks.megatron`).

Each is evaluated twice on the same costs: with its own order and with pp_opt's solved
order, so that the gain of the split and the gain of the order show apart.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

from pp_opt.errors import ProblemError
from pp_opt.frameworks import megatron
from pp_opt.frameworks import torchtitan as titan
from pp_opt.job import Job
from pp_opt.planner.config import Candidate, Pins
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule

PAIRED = {"DualPipeV": "dualpipev-overlap", "Interleaved1F1B": "interleaved-1f1b-a2a"}
"""A named schedule as a run that overlaps runs it (``problem.pairs``): PyTorch's DualPipeV with
its ``OVERLAP_F_B`` actions overlapped, and Megatron-Core's interleaved 1F1B with
``--overlap-moe-expert-parallel-comm`` (its steady-state F/B pairs)."""


def run_baseline(name: str, problem: Problem) -> Schedule:
    """PyTorch-named schedule ``name`` on ``problem`` (validated by :func:`pp_opt.baseline`),
    with its overlapped pairs where the problem allows them (:data:`PAIRED`)."""
    from pp_opt.orders import baseline

    hides = any(st.t_f_comm or st.t_b_comm for st in problem.stages)
    if problem.pairs and hides and name in PAIRED:  # else its pairs' halves run in sequence
        name = PAIRED[name]
    return baseline(name, problem)


def baseline_candidates(
    best: Candidate, layers: int, *, model: str = "", pins: Pins | None = None
) -> list[tuple[str, str, Candidate]]:
    """``(label, schedule, candidate)`` of the defaults for the best candidate's degrees.

    Same ``tp``, ``pp``, ``cp`` and ``dp`` as the best; recompute and offload off.
    torchtitan (:func:`torchtitan_job`): its settings for model card ``model`` where
    ``pins`` leave them to the plan (a pinned one is the best's), one chunk
    per device with its default schedule, and the chunks it builds for a multi-stage
    schedule (``loop``) with Interleaved1F1B; Megatron-LM: the best's settings, as many
    chunks with an even split (when it divides) and its interleaved schedule. Fixed chunk
    counts keep the defaults what a user would pick without a planner.
    """
    plain = best.job
    titan_job = torchtitan_job(plain, model, pins or Pins())
    out: list[tuple[str, str, Candidate]] = []
    one = replace(titan_job, v=1, placement="loop", layers=())
    split = titan.default_layers(layers, one.stages)
    out.append(("torchtitan", titan.default_schedule(1), _candidate(one, split)))
    chunks = titan.default_stages_per_rank(titan.INTERLEAVED_SCHEDULE)
    looped = replace(titan_job, v=chunks, placement="loop", layers=())
    if plain.pp > 1 and looped.stages <= layers:
        split = titan.default_layers(layers, looped.stages)
        out.append(("torchtitan", titan.default_schedule(chunks), _candidate(looped, split)))
        with contextlib.suppress(ProblemError):  # Megatron-LM refuses an uneven split
            even = megatron.default_layers(layers, looped.stages)
            schedule = megatron.pipeline_schedule(chunks)
            mine = replace(plain, v=chunks, placement="loop", layers=())
            out.append(("megatron", schedule, _candidate(mine, even)))
    return out


def torchtitan_job(job: Job, model: str, pins: Pins) -> Job:
    """``job``'s degrees and features with what torchtitan 0.3.0 runs by default for
    ``model`` (:func:`pp_opt.frameworks.torchtitan.model_defaults`) in place of what
    ``pins`` leave to the plan: FSDP over the data-parallel ranks, the config's
    checkpointing, its microbatch size."""
    sequences = job.microbatches * job.mbs  # one schedule's local batch
    changes: dict[str, Any] = {}
    if pins.dp_shard is None and pins.optimizer_sharding is None:
        changes.update(dp_shard=job.dp, dp_replicate=0, optimizer_sharding=False,
                       fp8_all_gather=None)  # fmt: skip
    if pins.ac is None:
        changes.update(ac=titan.model_defaults(model).ac, full_layers=())
    if pins.mbs is None:
        mbs = titan.default_microbatch_size(model, job.pp, sequences)
        changes.update(mbs=mbs, microbatches=sequences // mbs)
    return replace(job, **changes)


def _candidate(job: Job, layers: tuple[int, ...]) -> Candidate:
    return Candidate(job=job.with_layers(layers), recompute=False, offload=False, origin="baseline")
