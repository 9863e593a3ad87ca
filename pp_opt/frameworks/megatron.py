"""The Megatron-LM flags pp_opt prints, and where each one lands.

Checked against Megatron-LM ``core_v0.16.1`` (2026-03-16) and the ``megatron-core`` 0.16.1
wheel. ``megatron-core`` carries the config dataclasses, not the training script's argument
parser: ``megatron/training/arguments.py`` builds most flags from the dataclass fields
(``ArgumentGroupFactory(TransformerConfig)``, line 1621: field ``x_y`` is flag ``--x-y``)
and copies every argument named like a field into ``TransformerConfig``
(``core_transformer_config_from_args``, lines 1320-1322). The flags it declares itself are
listed with the line that declares them and the field they end in, if any.
"""

from __future__ import annotations

from dataclasses import dataclass

from pp_opt.arguments import integer
from pp_opt.errors import ProblemError
from pp_opt.profiler.layer_split import even_split

RELEASE = "Megatron-LM core_v0.16.1"
"""What the facts were checked against."""


@dataclass(kw_only=True, slots=True, frozen=True)
class MegatronFlag:
    """One flag of ``pretrain_gpt.py``."""

    flag: str
    """The flag."""
    config: str
    """``ModelParallelConfig``, ``TransformerConfig`` or ``DistributedDataParallelConfig``
    (megatron-core), or ``''``."""
    field: str
    """The field of ``config`` the flag sets (``''`` when it sets none)."""
    declared: str
    """``''`` when the flag is generated from ``config.field``; otherwise where the training
    script declares it (file:line in :data:`RELEASE`) and how it reaches the field."""


MEGATRON_FLAGS: dict[str, MegatronFlag] = {
    f.flag: f
    for f in (
        MegatronFlag(flag="--tensor-model-parallel-size", config="ModelParallelConfig",
                     field="tensor_model_parallel_size", declared=""),
        MegatronFlag(flag="--pipeline-model-parallel-size", config="ModelParallelConfig",
                     field="pipeline_model_parallel_size", declared=""),
        MegatronFlag(flag="--context-parallel-size", config="ModelParallelConfig",
                     field="context_parallel_size", declared=""),
        MegatronFlag(flag="--cp-comm-type", config="TransformerConfig", field="cp_comm_type",
                     declared=""),
        MegatronFlag(flag="--num-layers", config="TransformerConfig", field="num_layers",
                     declared=""),
        MegatronFlag(flag="--pipeline-model-parallel-layout", config="TransformerConfig",
                     field="pipeline_model_parallel_layout", declared=""),
        MegatronFlag(flag="--recompute-granularity", config="TransformerConfig",
                     field="recompute_granularity", declared=""),
        MegatronFlag(flag="--recompute-method", config="TransformerConfig",
                     field="recompute_method", declared=""),
        MegatronFlag(flag="--recompute-num-layers", config="TransformerConfig",
                     field="recompute_num_layers", declared=""),
        MegatronFlag(flag="--decoder-first-pipeline-num-layers", config="TransformerConfig",
                     field="num_layers_in_first_pipeline_stage",
                     declared="megatron/training/arguments.py:2209, copied at line 1329"),
        MegatronFlag(flag="--decoder-last-pipeline-num-layers", config="TransformerConfig",
                     field="num_layers_in_last_pipeline_stage",
                     declared="megatron/training/arguments.py:2213, copied at line 1330"),
        MegatronFlag(flag="--num-layers-per-virtual-pipeline-stage",
                     config="ModelParallelConfig", field="virtual_pipeline_model_parallel_size",
                     declared="megatron/training/arguments.py:2228, turned into the virtual "
                     "stage count at line 549"),
        MegatronFlag(flag="--recompute-modules", config="TransformerConfig",
                     field="recompute_modules", declared=""),
        MegatronFlag(flag="--expert-model-parallel-size", config="ModelParallelConfig",
                     field="expert_model_parallel_size", declared=""),
        MegatronFlag(flag="--expert-tensor-parallel-size", config="ModelParallelConfig",
                     field="expert_tensor_parallel_size", declared=""),
        MegatronFlag(flag="--moe-token-dispatcher-type", config="TransformerConfig",
                     field="moe_token_dispatcher_type", declared=""),
        MegatronFlag(flag="--moe-flex-dispatcher-backend", config="TransformerConfig",
                     field="moe_flex_dispatcher_backend", declared=""),
        MegatronFlag(flag="--overlap-moe-expert-parallel-comm", config="TransformerConfig",
                     field="overlap_moe_expert_parallel_comm", declared=""),
        MegatronFlag(flag="--delay-wgrad-compute", config="TransformerConfig",
                     field="delay_wgrad_compute", declared=""),
        MegatronFlag(flag="--use-distributed-optimizer",
                     config="DistributedDataParallelConfig", field="use_distributed_optimizer",
                     declared="megatron/training/arguments.py:2283, copied into the DDP config"),
        MegatronFlag(flag="--use-megatron-fsdp", config="DistributedDataParallelConfig",
                     field="use_megatron_fsdp",
                     declared="megatron/training/arguments.py:2305, copied into the DDP config"),
        MegatronFlag(flag="--data-parallel-sharding-strategy",
                     config="DistributedDataParallelConfig",
                     field="data_parallel_sharding_strategy",
                     declared="megatron/training/arguments.py:2307 (default no_shard), copied "
                     "into the DDP config"),
        MegatronFlag(flag="--num-distributed-optimizer-instances",
                     config="DistributedDataParallelConfig",
                     field="num_distributed_optimizer_instances",
                     declared="megatron/training/arguments.py:2333, copied into the DDP "
                     "config (Megatron-FSDP: HSDP when above 1)"),
        MegatronFlag(flag="--ckpt-format", config="", field="",
                     declared="megatron/training/training_config.py:411 (CheckpointConfig; "
                     "arguments.py:690 asserts fsdp_dtensor with --use-megatron-fsdp)"),
        MegatronFlag(flag="--micro-batch-size", config="", field="",
                     declared="megatron/training/training_config.py:10 (TrainingConfig, "
                     "flags built at arguments.py:2003)"),
        MegatronFlag(flag="--global-batch-size", config="", field="",
                     declared="megatron/training/training_config.py:14 (TrainingConfig, "
                     "flags built at arguments.py:2003)"),
    )
}  # fmt: skip
"""Every flag :func:`pp_opt.export.training_config.megatron_flags` prints."""


def pipeline_schedule(v: int) -> str:
    """PyTorch's name of the order Megatron-LM runs ``v`` model chunks per rank with:
    ``get_forward_backward_func`` (``megatron/core/pipeline_parallel/schedules.py``) picks
    ``forward_backward_pipelining_with_interleaving`` (interleaved 1F1B) when a virtual
    pipeline size is set, ``forward_backward_pipelining_without_interleaving`` (1F1B)
    otherwise."""
    return "1F1B" if v == 1 else "Interleaved1F1B"


def default_layers(n_layers: int, stages: int) -> tuple[int, ...]:
    """Megatron-LM's split without split flags: the same number of layers on every stage
    (:func:`pp_opt.profiler.layer_split.even_split`; it refuses layers that do not divide)."""
    integer("n_layers", n_layers, low=1)
    integer("stages", stages, low=1)
    split = even_split(n_layers, stages)
    if split is None:
        raise ProblemError(
            "stages", f"Megatron-LM splits {n_layers} layers evenly only over a divisor of "
            f"{n_layers}, not {stages} stages; give the split (first/last flags or a layout)"
        )  # fmt: skip
    return split
