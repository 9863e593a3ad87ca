"""Every Megatron-LM flag pp_opt prints lands on a field of megatron-core's config
dataclasses (megatron-core 0.16.1), so a renamed or removed one fails here; the flags only
the training script parses are listed with the release and line they were checked at."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pp_opt.export.training_config import megatron_flags
from pp_opt.frameworks.megatron import MEGATRON_FLAGS, RELEASE
from pp_opt.job import Job

core = pytest.importorskip("megatron.core", reason="pip install megatron-core==0.16.1")

CONFIGS: list[dict[str, Any]] = [
    dict(tp=2, pp=4, v=1, layers=[8, 8, 8, 8], recompute=True),
    dict(tp=1, pp=4, v=2, layers=[4] * 8, recompute=False),
    dict(tp=2, pp=2, v=1, layers=[16, 16], recompute=False, cp=2),
    dict(tp=1, pp=4, v=1, layers=[9, 8, 8, 7], recompute=False),
    dict(tp=1, pp=4, v=1, layers=[8, 9, 7, 8], recompute=False),
    dict(tp=1, pp=4, v=1, layers=[8] * 4, recompute=False, full_layers=(3,) * 4),
    dict(tp=1, pp=4, v=1, layers=[8] * 4, recompute=False, ac="selective"),
    dict(tp=1, pp=4, v=1, layers=[8] * 4, recompute=False, dp=8, dp_shard=4),
    dict(tp=1, pp=4, v=1, layers=[8] * 4, recompute=False, dp=8, optimizer_sharding=True),
    dict(
        tp=2,
        pp=4,
        v=1,
        layers=[8] * 4,
        recompute=False,
        ac="modules:layernorm,moe_act",
        dp=16,
        ep=32,
        dispatcher="deepep",
    ),
    dict(tp=1, pp=4, v=1, layers=[8] * 4, recompute=False, dp=8, ep=8, etp=1,
         dispatcher="alltoall", overlap=True),
]  # fmt: skip


def _printed() -> set[str]:
    flags: set[str] = set()
    for c in CONFIGS:
        job = _job(c)
        printed = megatron_flags(job, n_layers=sum(c["layers"]), recompute=c["recompute"])
        flags |= {f for f in printed if f.startswith("--")}
    return flags


def _job(c: dict[str, Any]) -> Job:
    keys = ("dp", "cp", "ep", "etp", "dispatcher", "overlap", "dp_shard", "optimizer_sharding")
    extra = {k: c[k] for k in keys if k in c}
    return Job(pp=c["pp"], v=c["v"], tp=c["tp"], layers=tuple(c["layers"]), mbs=1,
               microbatches=16, seq=4096, full_layers=c.get("full_layers", ()),
               ac=c.get("ac", "none"), **extra)  # fmt: skip


def _fields(config: str) -> set[str]:
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    cls = {"ModelParallelConfig": ModelParallelConfig, "TransformerConfig": TransformerConfig,
           "DistributedDataParallelConfig": DistributedDataParallelConfig}  # fmt: skip
    return {f.name for f in dataclasses.fields(cls[config])}


def test_every_printed_flag_is_known() -> None:
    printed = _printed()
    assert printed == set(MEGATRON_FLAGS), printed ^ set(MEGATRON_FLAGS)


@pytest.mark.parametrize("flag", sorted(MEGATRON_FLAGS))
def test_each_flag_sets_a_megatron_core_field(flag: str) -> None:
    fact = MEGATRON_FLAGS[flag]
    if fact.config:
        assert fact.field in _fields(fact.config), (flag, fact.field)
    if not fact.declared:  # generated from the field: the names must match
        assert flag == "--" + fact.field.replace("_", "-")
    else:
        assert ".py:" in fact.declared and RELEASE.endswith("0.16.1")
    if fact.config == "ModelParallelConfig":  # TransformerConfig inherits it
        assert fact.field in _fields("TransformerConfig")


def test_printed_recompute_values_pass_megatron_core_checks() -> None:
    """The recompute flags' values (full/selective, uniform/block, the layer count) are ones
    megatron-core's ``TransformerConfig`` accepts (it raises ValueError otherwise)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    seen = set()
    for c in CONFIGS:
        job = _job(c)
        printed = megatron_flags(job, n_layers=sum(c["layers"]), recompute=c["recompute"])
        values: dict[str, Any] = {
            MEGATRON_FLAGS[f].field: printed[i + 1]
            for i, f in enumerate(printed)
            if f.startswith("--recompute-")
        }
        if "recompute_modules" in values:  # nargs: every word up to the next flag
            start = printed.index("--recompute-modules") + 1
            words = printed[start:]
            values["recompute_modules"] = [
                w
                for w in words[
                    : next((i for i, w in enumerate(words) if w.startswith("--")), len(words))
                ]
            ]
        if not values:
            continue
        if "recompute_modules" in values:  # Megatron-Core's MoE modules need an MoE layer
            values.update(num_moe_experts=64, moe_grouped_gemm=True)
        if "recompute_num_layers" in values:
            values["recompute_num_layers"] = int(values["recompute_num_layers"])
        config = TransformerConfig(num_layers=sum(c["layers"]), hidden_size=256,
                                   num_attention_heads=8, **values)  # fmt: skip
        seen.add((config.recompute_granularity, config.recompute_method))
    assert seen == {("full", "uniform"), ("full", "block"), ("selective", None)}


def test_printed_expert_flags_pass_megatron_core_checks() -> None:
    """An MoE job's expert degrees and dispatcher are values megatron-core accepts."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    printed = megatron_flags(_job(CONFIGS[-2]), n_layers=32)
    at = {f: printed[i + 1] for i, f in enumerate(printed) if f.startswith("--")}
    assert at["--expert-model-parallel-size"] == "32"
    assert at["--moe-token-dispatcher-type"] == "flex"
    assert at["--moe-flex-dispatcher-backend"] == "deepep"
    assert printed[-2:] == ["layernorm", "moe_act"]
    config = TransformerConfig(
        num_layers=32, hidden_size=256, num_attention_heads=8, num_moe_experts=64,
        moe_router_topk=2, tensor_model_parallel_size=2, sequence_parallel=True,
        expert_model_parallel_size=32, expert_tensor_parallel_size=1, add_bias_linear=False,
        moe_token_dispatcher_type="flex",
        moe_flex_dispatcher_backend="deepep", recompute_granularity="selective",
        recompute_modules=["layernorm", "moe_act"], moe_grouped_gemm=True,
    )  # fmt: skip
    assert config.moe_flex_dispatcher_backend == "deepep"
    assert not any(f.startswith("--expert") for f in megatron_flags(_job(CONFIGS[0]), n_layers=32))
    overlapped = megatron_flags(_job(CONFIGS[-1]), n_layers=32)
    assert (
        "--overlap-moe-expert-parallel-comm" in overlapped and "--delay-wgrad-compute" in overlapped
    )
    assert "--overlap-moe-expert-parallel-comm" not in printed


def test_printed_context_parallel_flags_pass_megatron_core_checks() -> None:
    """A context-parallel job prints Megatron-Core's CP degree and its default ring (p2p),
    which ``TransformerConfig`` accepts; a job without CP prints neither."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    c = next(c for c in CONFIGS if c.get("cp"))
    printed = megatron_flags(_job(c), n_layers=sum(c["layers"]))
    at = {f: printed[i + 1] for i, f in enumerate(printed) if f.startswith("--")}
    assert at["--context-parallel-size"] == "2" and at["--cp-comm-type"] == "p2p"
    config = TransformerConfig(num_layers=32, hidden_size=256, num_attention_heads=8,
                               context_parallel_size=2, cp_comm_type="p2p")  # fmt: skip
    assert config.context_parallel_size == 2
    assert "--context-parallel-size" not in megatron_flags(_job(CONFIGS[0]), n_layers=32)


def test_printed_fsdp_flags_make_megatron_core_shard() -> None:
    """An FSDP job's flags give megatron-core's DDP config Megatron-FSDP sharding parameters,
    gradients and optimizer state (the flag's default, ``no_shard``, shards nothing), with the
    replicas as distributed-optimizer instances (HSDP)."""
    from megatron.core.distributed import DistributedDataParallelConfig

    printed = megatron_flags(_job(next(c for c in CONFIGS if c.get("dp_shard"))), n_layers=32)
    values = {MEGATRON_FLAGS[f].field: printed[i + 1] for i, f in enumerate(printed)
              if f.startswith("--") and MEGATRON_FLAGS[f].config == "DistributedDataParallelConfig"
              and i + 1 < len(printed) and not printed[i + 1].startswith("--")}  # fmt: skip
    config = DistributedDataParallelConfig(
        use_megatron_fsdp=True, data_parallel_sharding_strategy=values[
            "data_parallel_sharding_strategy"],
        num_distributed_optimizer_instances=int(values["num_distributed_optimizer_instances"]),
    )  # fmt: skip
    assert config.data_parallel_sharding_strategy == "optim_grads_params"
    assert config.num_distributed_optimizer_instances == 2
