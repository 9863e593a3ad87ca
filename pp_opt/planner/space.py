"""Step 1 of a plan: every legal configuration, and how many were skipped and why.

A dimension a user pinned takes the pinned values; the others take every legal value:
``tp`` divides the node's GPUs, the job's GPUs and the heads; ``pp`` divides the GPUs left;
``dp = gpus / (tp * pp)``; ``mbs`` divides the sequences of one replica, so that
``m = global_batch / (dp * mbs)`` is whole (:func:`pp_opt.job.microbatch_count`); a
``loop`` placement has ``v`` chunks with ``pp * v`` at most the layers (``v > 1`` needs
``pp > 1``); the ``v`` placement has two; recompute and offload are each allowed or not
(without checkpointing, unless pinned); the optimizer state is sharded over ``dp`` or not
(only ``dp > 1`` has a choice). Without
pins, ``ac`` takes every checkpointing mode the stack runs (its card's ``ac_modes``) and the
data-parallel ranks run plain (``dp_shard = 1``), FSDP over all of them (``dp_shard = dp``,
torchtitan's default) or, where they span nodes, HSDP with a node's ranks in each shard
group, where the stack shards its state FSDP-style. A
pinned value that breaks a rule is skipped and counted under its reason.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pp_opt.errors import ProblemError
from pp_opt.job import DEFAULTS, Job, microbatch_count
from pp_opt.planner.config import PINNED, Candidate, Pins, PlanInputs
from pp_opt.profiler.stacks import expert_ranks, load_stack_card

PLACEMENTS = ("loop", "v")


@dataclass(kw_only=True, slots=True)
class Enumeration:
    """The legal configurations, in a fixed order, and the skipped ones counted by reason."""

    configs: list[Candidate] = field(default_factory=list)
    """Legal configurations (their layers not split yet)."""
    skipped: Counter[str] = field(default_factory=Counter)
    """Reason -> how many (partial) configurations it skipped."""


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tp_values(inputs: PlanInputs, pins: Pins, skipped: Counter[str]) -> list[int]:
    card, node = inputs.model, inputs.hardware.gpus_per_node
    out = []
    for tp in pins.tp or tuple(divisors(node)):
        if node % tp:
            skipped[f"tp does not divide gpus_per_node ({node})"] += 1
        elif inputs.gpus % tp:
            skipped["tp does not divide gpus"] += 1
        elif card.heads % tp or card.num_kv_heads % tp:
            skipped["tp does not divide the heads"] += 1
        else:
            out.append(tp)
    return out


def _pp_values(inputs: PlanInputs, pins: Pins, tp: int, skipped: Counter[str]) -> list[int]:
    out = []
    for pp in pins.pp or tuple(divisors(inputs.gpus // tp)):
        if (inputs.gpus // tp) % pp:
            skipped["tp * pp does not divide gpus"] += 1
        elif pp > inputs.model.layers:
            skipped["pp above the layers"] += 1
        else:
            out.append(pp)
    return out


def _mbs_values(
    inputs: PlanInputs, pins: Pins, dp: int, skipped: Counter[str]
) -> list[tuple[int, int]]:
    """``(mbs, microbatches)`` of each microbatch size that splits the batch whole."""
    ga = pins.grad_accum
    if inputs.global_batch % (dp * ga):
        skipped["dp x grad_accum does not divide global_batch"] += 1
        return []
    out = []
    for mbs in pins.mbs or tuple(divisors(inputs.global_batch // (dp * ga))):
        try:
            out.append((mbs, microbatch_count(global_batch=inputs.global_batch, dp=dp, mbs=mbs,
                                              grad_accum=ga)))  # fmt: skip
        except ProblemError:
            skipped["dp * mbs does not divide global_batch"] += 1
    return out


def _chunk_values(
    inputs: PlanInputs, pins: Pins, pp: int, skipped: Counter[str]
) -> list[tuple[str, int]]:
    layers = inputs.model.layers
    out = []
    for placement in pins.placement or (PLACEMENTS if pp > 1 else ("loop",)):
        if placement not in PLACEMENTS:
            skipped[f"unknown placement {placement!r}"] += 1
        elif placement == "v":
            if pins.v is not None and 2 not in pins.v:
                skipped["v placement needs v = 2"] += 1
            elif pp < 2:
                skipped["v placement needs pp >= 2"] += 1
            elif 2 * pp > layers:
                skipped["pp * v above the layers"] += 1
            else:
                out.append(("v", 2))
        else:
            default = tuple(range(1, layers // pp + 1)) if pp > 1 else (1,)
            for v in pins.v or default:
                if v > 1 and pp == 1:
                    skipped["v > 1 needs pp >= 2"] += 1
                elif pp * v > layers:
                    skipped["pp * v above the layers"] += 1
                else:
                    out.append(("loop", v))
    return out


def _switches(pins: Pins, dp: int, ac: str) -> list[tuple[bool, bool, bool]]:
    """``(recompute, offload, optimizer sharding)`` choices. The solver's own recompute and
    offload are tried on the model without checkpointing; a checkpointing mode the plan
    picked itself (``ac`` unpinned) runs without them unless they are pinned on. The
    optimizer is sharded beside replicated weights only where the stack does that
    (Megatron-Core's distributed optimizer); an FSDP stack shards it through ``dp_shard``."""
    both = (False, True)
    off = (False,) if ac != "none" and pins.ac is None else both
    recompute = off if pins.recompute is None else (pins.recompute,)
    offload = off if pins.offload is None else (pins.offload,)
    if dp == 1:
        sharding: tuple[bool, ...] = (False,)
    elif pins.optimizer_sharding is None:
        sharding = both if load_stack_card(pins.stack).optimizer == "distributed" else (False,)
    else:
        sharding = (pins.optimizer_sharding,)
    return list(itertools.product(recompute, offload, sharding))


def _data_parallel(
    inputs: PlanInputs, pins: Pins, tp: int, pp: int, skipped: Counter[str]
) -> list[tuple[int, int, int]]:
    """``(cp, dp, dp_shard)`` choices of one ``tp x pp``."""
    out = []
    for cp in pins.cp or (1,):
        if (inputs.gpus // (tp * pp)) % cp:
            skipped["tp * pp * cp does not divide gpus"] += 1
            continue
        dp = inputs.gpus // (tp * pp * cp)
        for shard in pins.dp_shard or _shard_values(inputs, pins, dp, tp * cp):
            if dp % shard:
                skipped["dp_shard does not divide dp"] += 1
            else:
                out.append((cp, dp, shard))
    return out


def _shard_values(inputs: PlanInputs, pins: Pins, dp: int, group: int) -> tuple[int, ...]:
    """Unpinned FSDP degrees, where the stack's FSDP shards the state: none, over every
    data-parallel rank (torchtitan's ``data_parallel_shard_degree = -1``), and, where those
    ranks span nodes, over the ones of a node (HSDP: the shard group, ``dp_shard x cp x
    tp`` consecutive ranks of torchtitan's mesh, gathers over the node's links; its
    replicas all-reduce the gradients across nodes). ``group``: ``tp x cp``."""
    if dp == 1 or load_stack_card(pins.stack).optimizer != "fsdp":
        return (1,)
    node = inputs.hardware.gpus_per_node // group
    if 1 < node < dp and dp % node == 0:
        return (1, node, dp)
    return (1, dp)


def searched_values(pins: Pins, name: str) -> tuple[Any, ...]:
    """The values of ``values`` field ``name`` a plan tries: the pinned ones, else the
    stack's checkpointing modes for ``ac`` and the job's default for the others."""
    pin = pins.values[name]
    if pin is not None:
        return tuple(pin)
    if name == "ac":
        return load_stack_card(pins.stack).ac_modes
    return (DEFAULTS[name],)


STRUCTURAL = ("tp", "pp", "v", "placement", "mbs", "cp", "dp_shard", "optimizer_sharding",
              "ep", "etp")  # fmt: skip
"""Job fields whose legal values this module works out itself (the rest are :func:`_settings`)."""


def _settings(pins: Pins, tp: int) -> list[dict[str, Any]]:
    """Every combination of the other pinned job fields for ``tp``: each ``values`` field's
    pinned values (:func:`searched_values` when unpinned), each allowed feature (AsyncTP only
    with ``tp > 1``), each ``fixed`` field's value."""
    axes: list[list[tuple[str, Any]]] = []
    for name, spec in PINNED.items():
        if name in STRUCTURAL:
            continue
        pin = pins.values[name]
        if spec.plan == "values":
            values = searched_values(pins, name)
        elif spec.plan == "allow":
            values = (bool(pin) and (tp > 1 or name != "async_tp"),)
        else:
            values = (pin,)
        axes.append([(name, value) for value in values])
    return [dict(combo) for combo in itertools.product(*axes)]


def _experts(inputs: PlanInputs, pins: Pins, ranks: int, skipped: Counter[str]
             ) -> list[tuple[int, int]]:  # fmt: skip
    """``(ep, etp)`` choices of a stage whose experts borrow ``ranks`` GPUs (``dp x cp x tp``,
    or what the stack lets them borrow: :func:`pp_opt.profiler.stacks.expert_ranks`, 0 where
    it runs no experts under plain data parallelism): ``ep`` divides the routed experts and,
    times ``etp``, the ranks; a dense model has only ``(1, 1)``."""
    experts = inputs.model.experts
    if not experts:
        return [(1, 1)]
    if ranks == 0:
        skipped["the stack runs no expert parallelism under plain data parallelism"] += 1
        return []
    out = []
    for etp in pins.etp or (1,):
        for ep in pins.ep or tuple(d for d in divisors(experts) if d > 1 or experts == 1):
            if experts % ep:
                skipped["ep does not divide the experts"] += 1
            elif ranks % (ep * etp):
                skipped["ep x etp does not divide the ranks experts borrow"] += 1
            else:
                out.append((ep, etp))
    return out


def enumerate_configs(inputs: PlanInputs, pins: Pins) -> Enumeration:
    """Every legal configuration of ``inputs`` under ``pins`` (candidates whose layers are
    not split yet), skipped ones counted."""
    result = Enumeration()
    skipped = result.skipped
    for tp in _tp_values(inputs, pins, skipped):
        settings = _settings(pins, tp)
        for pp in _pp_values(inputs, pins, tp, skipped):
            counted: set[tuple[int, ...]] = set()
            for cp, dp, shard in _data_parallel(inputs, pins, tp, pp, skipped):
                # a skip is counted once per (cp, dp), however many FSDP degrees share it;
                # an expert layout's once per the ranks it borrows
                tally = skipped if (cp, dp) not in counted else Counter()
                ranks = expert_ranks(load_stack_card(pins.stack), dp=dp, dp_shard=shard)
                key = (cp, dp, ranks)
                experts = _experts(inputs, pins, ranks * cp * tp, skipped if key not in counted
                                   else Counter())  # fmt: skip
                counted |= {(cp, dp), key}
                for mbs, m in _mbs_values(inputs, pins, dp, tally):
                    layout = dict(tp=tp, pp=pp, dp=dp, mbs=mbs, microbatches=m, seq=inputs.seq,
                                  cp=cp, dp_shard=shard)  # fmt: skip
                    for (placement, v), (ep, etp), features, switches in (
                        (chunk, expert, setting, switches)
                        for chunk, expert, setting in itertools.product(
                            _chunk_values(inputs, pins, pp, tally), experts, settings)
                        for switches in _switches(pins, 1 if shard > 1 else dp, setting["ac"])
                    ):  # fmt: skip
                        job = _job(tally, layout, placement=placement, v=v, ep=ep, etp=etp,
                                   optimizer_sharding=switches[2], **features)  # fmt: skip
                        if job is not None:
                            result.configs.append(
                                Candidate(job=job, recompute=switches[0], offload=switches[1])
                            )
    return result


def _job(skipped: Counter[str], layout: dict[str, Any], **more: Any) -> Job | None:
    """The job, or None when it is beyond pp_opt's limits (counted)."""
    try:
        return Job(**layout, **more)
    except ProblemError as err:
        skipped[f"beyond pp_opt's limits ({err.field})"] += 1
        return None
