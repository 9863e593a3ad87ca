"""A configuration as a training job takes it: torchtitan's config keys, Megatron-LM's flags.

Both take a :class:`~pp_opt.job.Job` with its layers split (docs/design.md §8): ``pp``
devices, ``v`` chunks per device on the ``loop`` or ``v`` placement, and ``layers``, the
decoder layers of each stage in stage order (``len(layers) == pp * v``), with the embedding
on stage 0 and the final norm and output layer on the last stage; the microbatches and the
global batch are the job's too.

- torchtitan: :mod:`pp_opt.export.torchtitan` (``torchtitan_config``: the ``parallelism``
  fields, the split given exactly as ``module_fqns_per_model_part``; the whole job as
  flags or a config file), on the pipeline shape checked here (:func:`check_shape`).
- :func:`megatron_flags`: the command-line flags of Megatron-LM's ``pretrain_gpt.py``; an
  even split is ``--num-layers-per-virtual-pipeline-stage`` (with ``v > 1``), a split
  that differs only on the first and last stage is
  ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``, and
  any other is ``--pipeline-model-parallel-layout`` (``E`` embedding, ``t`` decoder
  layer, ``L`` loss, stages split by ``|``).

The splits each makes when not given one are framework facts
(:func:`pp_opt.frameworks.torchtitan.default_layers`,
:func:`pp_opt.frameworks.megatron.default_layers`). Bad input raises
:class:`~pp_opt.errors.ProblemError` naming the argument.
"""

from __future__ import annotations

from collections.abc import Sequence

from pp_opt.arguments import flag, integer, of_type
from pp_opt.errors import ProblemError
from pp_opt.job import Job

_RECOMPUTE_FLAGS = ("--recompute-granularity", "full", "--recompute-method", "uniform",
                    "--recompute-num-layers", "1")  # fmt: skip


def _checkpoint_flags(job: Job, *, recompute: bool) -> tuple[str, ...]:
    """Megatron-LM's activation recompute flags for the job's checkpointing (megatron-core
    ``TransformerConfig.recompute_granularity/method/num_layers``): ``full`` -> every layer
    (uniform, 1); ``full_layers`` -> the block method, one count for every stage;
    ``selective`` -> the attention core (Megatron's own selective, Korthikanti et al.)."""
    mode = job.ac
    if recompute or mode == "full":
        return _RECOMPUTE_FLAGS
    if job.full_layers and any(job.full_layers):
        counts = set(job.full_layers)
        if len(counts) > 1 or mode != "none":
            raise ProblemError(
                "full_layers", f"Megatron-LM checkpoints one number of layers on every stage "
                f"and nothing else (block method); got {list(job.full_layers)} with the rest "
                f"{mode}: give every stage the same count and ac none"
            )  # fmt: skip
        return ("--recompute-granularity", "full", "--recompute-method", "block",
                "--recompute-num-layers", str(counts.pop()))  # fmt: skip
    if mode == "selective":
        return ("--recompute-granularity", "selective")
    if job.recompute_modules:
        return ("--recompute-granularity", "selective", "--recompute-modules",
                *job.recompute_modules)  # fmt: skip
    if mode == "selective_op":
        raise ProblemError(
            "ac", "Megatron-LM has no op-level selective checkpointing "
            "(torchtitan's selective_op); use none, selective or full for Megatron-LM"
        )  # fmt: skip
    return ()


# ---------------------------------------------------------------- checks


def check_shape(job: Job, *, n_layers: int | None = None) -> list[int]:
    """The job's checked split: ``pp * v`` non-negative counts summing to ``n_layers``
    (the model's decoder layers; None: the split's own sum). The degrees, placement and
    ``v`` are the job's own checks (:class:`~pp_opt.job.Job`)."""
    of_type("job", job, Job, "a pp_opt Job")
    counts = list(job.layers)
    if not counts:
        raise ProblemError(
            "layers", f"the job has no split; give one count per stage, pp * v = {job.stages}"
        )
    for count in counts:
        if count < 0:
            raise ProblemError(
                "layers", f"entry {count!r} is not a layer count; give integers >= 0"
            )
    if n_layers is not None and sum(counts) != integer("n_layers", n_layers, low=1):
        raise ProblemError(
            "layers", f"the counts sum to {sum(counts)}; they must sum to n_layers = {n_layers}"
        )
    return counts


# ---------------------------------------------------------------- Megatron-LM


def pipeline_layout(layers: Sequence[int]) -> str:
    """Megatron-LM's ``--pipeline-model-parallel-layout`` string of a split (stage order)."""
    stages = []
    for s, count in enumerate(layers):
        text = "t" if count == 1 else f"t*{count}" if count else ""
        if s == 0:
            text = "E" + text
        if s == len(layers) - 1:
            text += "L"
        stages.append(text)
    return "|".join(stages)


def _split_flags(counts: list[int], *, pp: int, v: int) -> list[str]:
    """The flags that give Megatron-LM this split, the simplest set that says it exactly."""
    if len(set(counts)) == 1:
        return [] if v == 1 else ["--num-layers-per-virtual-pipeline-stage", str(counts[0])]
    if v == 1 and pp >= 2:
        middle = counts[1:-1]
        if len(set(middle)) <= 1 and (not middle or middle[0] > 0):
            rest = middle[0] if middle else counts[-1]
            flags = []
            if counts[0] != rest:
                flags += ["--decoder-first-pipeline-num-layers", str(counts[0])]
            if counts[-1] != rest and middle:
                flags += ["--decoder-last-pipeline-num-layers", str(counts[-1])]
            return flags
    return ["--pipeline-model-parallel-layout", pipeline_layout(counts)]


def megatron_flags(job: Job, *, n_layers: int | None = None, recompute: bool = False) -> list[str]:
    """Megatron-LM command-line flags for ``job`` (``pretrain_gpt.py``).

    Parameters
    ----------
    job
        ``tp``, ``pp``, ``v`` (virtual stages), ``layers`` (decoder layers per stage in stage
        order), ``mbs`` (``--micro-batch-size``) and the global batch
        (``--global-batch-size``, :attr:`~pp_opt.job.Job.global_batch`, sequences). Its
        placement must be ``loop``: Megatron-LM places virtual stages round-robin (stage
        ``s`` on rank ``s mod pp``); the ``v`` placement raises :class:`ProblemError`.
    n_layers
        The model's decoder layers (``--num-layers``), checked against the split; None: the
        split's sum.
    recompute
        Full activation recompute of every layer (``--recompute-granularity full
        --recompute-method uniform --recompute-num-layers 1``): Megatron-LM recomputes
        every microbatch, where pp_opt's schedule may recompute only some. Without it the
        job's own checkpointing gives the flags (:func:`_checkpoint_flags`; Megatron-Core's
        ``modules:...`` as ``--recompute-modules``); torchtitan's
        ``selective_op`` and uneven ``full_layers`` raise :class:`ProblemError` (Megatron-LM
        cannot run them). An MoE job adds its expert parallelism and dispatcher
        (:func:`expert_flags`).

    Returns
    -------
    list[str]
        Flags and values, in the order Megatron-LM's help lists them by group.
    """
    counts = check_shape(job, n_layers=n_layers)
    flag("recompute", recompute)
    if job.placement != "loop":
        raise ProblemError(
            "placement",
            "Megatron-LM places virtual stages in a loop (stage s on rank s mod pp), not "
            "in a V; use placement 'loop', or torchtitan for the V schedules",
        )
    if job.v > 1 and job.pp < 2:
        raise ProblemError("v", f"got v = {job.v} with pp = 1; Megatron-LM interleaves virtual "
                           "stages only over pp >= 2 ranks: use v = 1")  # fmt: skip
    flags = [
        "--tensor-model-parallel-size", str(job.tp),
        "--pipeline-model-parallel-size", str(job.pp),
        *(["--context-parallel-size", str(job.cp), "--cp-comm-type", "p2p"] if job.cp > 1
          else []),
        "--num-layers", str(sum(counts)),
        *_split_flags(counts, pp=job.pp, v=job.v),
        "--micro-batch-size", str(job.mbs),
        "--global-batch-size", str(job.global_batch),
        *data_parallel_flags(job),
    ]  # fmt: skip
    return flags + expert_flags(job) + list(_checkpoint_flags(job, recompute=recompute))


def data_parallel_flags(job: Job) -> list[str]:
    """How Megatron-LM shards the job's data-parallel state (its data-parallel degree is what
    tp x pp x cp leave). FSDP (``dp_shard`` > 1) is Megatron-FSDP sharding parameters,
    gradients and optimizer state (``optim_grads_params``: Megatron-LM core_v0.16.1 defaults
    ``--data-parallel-sharding-strategy`` to ``no_shard``, which shards nothing) over
    ``dp_shard x cp`` ranks, replicated ``dp_replicate`` times (HSDP: the replicas are
    ``--num-distributed-optimizer-instances``, ``mcore_fsdp_adapter.py``: ``enable_hsdp``),
    saved as ``fsdp_dtensor`` (``arguments.py`` asserts that format with Megatron-FSDP). A
    sharded optimizer beside replicated weights, as the job asks or as a
    distributed-optimizer stack always runs, is ``--use-distributed-optimizer``; without
    either the state is replicated (Megatron-LM's default)."""
    from pp_opt.profiler.stacks import load_stack_card

    if job.dp_shard > 1:
        flags = ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                 "optim_grads_params", "--ckpt-format", "fsdp_dtensor"]  # fmt: skip
        if job.dp_replicate > 1:
            flags += ["--num-distributed-optimizer-instances", str(job.dp_replicate)]
        return flags
    distributed = load_stack_card(job.stack).optimizer == "distributed"
    if job.dp * job.cp > 1 and (job.optimizer_sharding or distributed):
        return ["--use-distributed-optimizer"]
    return []


MEGATRON_FSDP_ENV = "unset CUDA_DEVICE_MAX_CONNECTIONS"
"""What a Megatron-FSDP job's environment needs: Megatron-LM asserts
``CUDA_DEVICE_MAX_CONNECTIONS`` is not 1 with ``--use-megatron-fsdp`` (``arguments.py``),
and Megatron-LM's example scripts set it to 1 for tensor-parallel overlap."""


MEGATRON_DISPATCHERS = {"alltoall": ("alltoall",), "allgather": ("allgather",),
                        "deepep": ("flex", "deepep"), "hybridep": ("flex", "hybridep")}  # fmt: skip
"""pp_opt's dispatcher -> Megatron-Core's ``--moe-token-dispatcher-type`` (and the flex
dispatcher's ``--moe-flex-dispatcher-backend``)."""


def expert_flags(job: Job) -> list[str]:
    """The expert-parallel flags of an MoE job (``ep`` or ``etp`` above 1, or a dispatcher
    named): the degrees and the token dispatcher (the stack's default when the job names
    none), and Megatron-Core's A2A overlap when the job overlaps F&B pairs; none for a dense
    job."""
    if job.ep == 1 and job.etp == 1 and not job.dispatcher:
        return []
    from pp_opt.profiler.stacks import load_stack_card

    kind, *backend = MEGATRON_DISPATCHERS[job.dispatcher or load_stack_card(job.stack).dispatcher]
    flags = ["--expert-model-parallel-size", str(job.ep),
             "--expert-tensor-parallel-size", str(job.etp),
             "--moe-token-dispatcher-type", kind]  # fmt: skip
    flags += ["--moe-flex-dispatcher-backend", backend[0]] if backend else []
    if job.overlap:  # the 1F1B A2A overlap; its W runs apart, as the pairs' W do
        flags += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    return flags
