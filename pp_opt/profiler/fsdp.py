"""FSDP / HSDP (ZeRO-3) as torchtitan runs it: sharded static memory, per-step traffic, exposure.

Sources (scripts/published/NOTES.md, "FSDP with pipeline parallelism", has the lines):

* Each ``TransformerBlock`` is its own FSDP2 group and the model (embeddings, final norm,
  output layer) the root group (torchtitan ``parallelize_llama.py:325-339`` at 9dec370);
  parameters all-gather in bf16 (``mixed_precision_param``), Float8 linear weights in FP8 with
  ``enable_fsdp_float8_all_gather``; gradients reduce-scatter in fp32
  (``mixed_precision_reduce``, ``config_manager.py:389-397``).
* Without a pipeline, every block but the last reshards after forward, so its parameters are
  all-gathered twice per step (F and B) and its gradients reduce-scattered once.
* With a pipeline, blocks do not reshard after forward (``parallelize_llama.py:326-329``) and
  the pipeline stage turns off resharding and gradient sync for every backward but the last
  (``torch.distributed.pipelining.stage._PipelineStageBase.backward_maybe_with_nosync``, torch
  of 2024-12): one all-gather per stage per step, one reduce-scatter per stage after its last
  microbatch's backward, and the stage's unsharded parameters and its unsharded gradients
  (accumulated in the reduce dtype, fp32: FSDP2 ``FSDPParam.to_accumulated_grad_if_needed``)
  are held from the first forward (first backward) to the stage's last backward.
* Sharded state: fp32 master parameters, fp32 gradients and AdamW's two fp32 moments, split
  over the shard degree only (HSDP replicates them ``replicate`` times).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pp_opt.errors import ProblemError
from pp_opt.profiler.stacks import load_stack_card

if TYPE_CHECKING:
    from pp_opt.job import Job

MASTER_BYTES = 4.0
"""fp32 sharded parameter (FSDP2 keeps the original dtype; torchtitan builds fp32 models)."""
SHARDED_GRAD_BYTES = 4.0
"""fp32 sharded gradient (the reduce-scatter output, ``reduce_dtype`` float32)."""
ADAM_BYTES = 8.0
"""AdamW's ``exp_avg`` and ``exp_avg_sq`` in fp32."""


SHARD_OVER_CP = True
"""torchtitan applies FSDP over the ``dp_shard_cp`` mesh (``dp_shard x cp``,
``parallelize_llama.py:79-94`` at 9dec370; the same in 0.3.0), so a context-parallel group
shards the parameters, gradients and optimizer state too, even with ``dp_shard`` 1."""


def fsdp_shard(job: Job) -> int:
    """The FSDP shard degree of ``job``: ``dp_shard x cp`` (:data:`SHARD_OVER_CP`). A stack
    with Megatron-Core's distributed optimizer runs FSDP only where ``dp_shard`` asks for it
    (Megatron FSDP): its context-parallel ranks share the optimizer's shards instead (the
    optimizer and the gradient reduction use the data-parallel group with context parallel,
    ``get_data_parallel_group(with_context_parallel=True)``;
    :func:`pp_opt.profiler.analytic.job_bytes_per_param`)."""
    if job.dp_shard == 1 and load_stack_card(job.stack).optimizer == "distributed":
        return 1
    return job.dp_shard * (job.cp if SHARD_OVER_CP else 1)


def fsdp_on(job: Job) -> bool:
    """FSDP runs the job: a shard degree > 1, or a stack that wraps every job in FSDP2 (one
    shard: the state whole, the buffers and the fp32 reduction all the same) unless the job
    asks for a sharded optimizer beside replicated weights, a runtime such a stack does not
    have (its export refuses the job; pp_opt still costs it as asked)."""
    if fsdp_shard(job) > 1:
        return True
    return load_stack_card(job.stack).fsdp_always and not job.optimizer_sharding


def _degree(field: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ProblemError(field, f"got {value!r}; expected an integer >= 1")


def sharded_state_bytes(params: float, *, shard: int) -> float:
    """Bytes per GPU of the sharded parameters, gradients and AdamW state of ``params``."""
    _degree("dp_shard", shard)
    return params * (MASTER_BYTES + SHARDED_GRAD_BYTES + ADAM_BYTES) / shard


def unsharded_bytes(
    params: float, *, param_bytes: float = 2.0, grad_bytes: float = 4.0, with_grads: bool = True
) -> float:
    """Bytes of ``params`` held unsharded: all-gathered weights (``param_bytes``: 2 for bf16,
    1 for FP8 all-gather) plus, once their backward has run, the accumulated fp32 gradients."""
    return params * (param_bytes + (grad_bytes if with_grads else 0.0))


def ring_bytes(payload_bytes: float, group: int) -> float:
    """Bytes each GPU sends in a ring all-gather or reduce-scatter of a ``payload_bytes``
    (unsharded) tensor over ``group`` GPUs: ``(g - 1) / g`` of it."""
    _degree("group", group)
    return payload_bytes * (group - 1) / group


def ring_time(payload_bytes: float, group: int, *, gbs: float, latency_us: float) -> float:
    """Seconds of one ring all-gather or reduce-scatter: ``g - 1`` steps of latency plus the
    bytes each GPU sends at ``gbs`` (GB/s each way). An all-reduce is two of these."""
    if group == 1:
        return 0.0
    if gbs <= 0:
        raise ProblemError("gbs", f"got {gbs}; a bandwidth must be > 0")
    return (group - 1) * latency_us * 1e-6 + ring_bytes(payload_bytes, group) / (gbs * 1e9)


@dataclass(kw_only=True, slots=True, frozen=True)
class FsdpStepTraffic:
    """Per-GPU bytes of one training step's FSDP collectives for one group of parameters."""

    all_gather_bytes: float
    """Bytes sent in the parameter all-gathers of the step."""
    reduce_scatter_bytes: float
    """Bytes sent in the gradient reduce-scatters of the step."""
    all_reduce_bytes: float
    """Bytes sent in HSDP's all-reduce of the sharded gradients over the replicas."""


def step_traffic(
    params: float, *, shard: int, replicate: int = 1, pipelined: bool, reshards: bool = True,
    param_bytes: float = 2.0, grad_bytes: float = 4.0,
) -> FsdpStepTraffic:  # fmt: skip
    """Traffic of ``params`` (one FSDP group, or the sum of a stage's groups) per step.

    ``pipelined``: one all-gather per step (no reshard after forward under PP). Otherwise two
    when the group reshards after forward (every torchtitan block but the last), else one.
    """
    _degree("dp_replicate", replicate)
    gathers = 1 if pipelined or not reshards else 2
    ag = gathers * ring_bytes(params * param_bytes, shard)
    rs = ring_bytes(params * grad_bytes, shard)
    ar = 2.0 * ring_bytes(params * grad_bytes / shard, replicate)
    return FsdpStepTraffic(all_gather_bytes=ag, reduce_scatter_bytes=rs, all_reduce_bytes=ar)


def exposed_per_layer(comm_s: float, compute_s: float) -> float:
    """What a prefetched per-layer collective leaves exposed behind the layer's compute."""
    return max(comm_s - compute_s, 0.0)


def pipelined_exposed_time(
    *, first_layer_gather_s: float, layer_gather_s: float, layer_forward_s: float, layers: int,
    last_stage_reduce_scatter_s: float,
) -> float:  # fmt: skip
    """Exposed FSDP time per step on the pipeline rank that finishes last (rank 0).

    Under PP the all-gathers run in each stage's first forward, prefetched one layer ahead:
    the first layer's is exposed, the others only where they outlast a layer's forward. The
    reduce-scatter of the stage whose backward ends the step (rank 0's first stage: the
    whole stage under 1F1B, the first chunk under interleaving) has nothing left to hide
    behind; earlier stages' reduce-scatters overlap later backwards.
    """
    if layers < 1:
        raise ProblemError("layers", f"got {layers}; a stage has at least one layer")
    hidden_gathers = (layers - 1) * exposed_per_layer(layer_gather_s, layer_forward_s)
    return first_layer_gather_s + hidden_gathers + last_stage_reduce_scatter_s
