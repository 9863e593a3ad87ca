"""torchtitan config keys and Megatron-LM flags for known configurations; bad input names
the argument."""

from __future__ import annotations

from typing import Any

import pytest

from pp_opt.errors import ProblemError
from pp_opt.export.torchtitan import torchtitan_config
from pp_opt.export.training_config import megatron_flags, pipeline_layout
from pp_opt.job import Job, microbatch_count

_EXPORT_ARGS = ("n_layers", "recompute", "schedule_csv", "schedule_name", "version")
"""What an exporter takes beside the job."""


def _job_and_rest(args: dict[str, Any]) -> tuple[Job, dict[str, Any]]:
    """A loose configuration as a Job (microbatches from the global batch) and the rest."""
    rest = {key: args.pop(key) for key in _EXPORT_ARGS if key in args}
    global_batch = args.pop("global_batch", None)
    if global_batch is not None:
        args["microbatches"] = microbatch_count(global_batch=global_batch, dp=1, mbs=args["mbs"])
    return Job(seq=4096, **{"microbatches": 8, **args, "layers": tuple(args["layers"])}), rest


def _megatron(**changes: Any) -> list[str]:
    args: dict[str, Any] = dict(tp=1, pp=4, v=1, placement="loop", mbs=1, layers=[8, 8, 8, 8],
                                n_layers=32, global_batch=16, recompute=False)  # fmt: skip
    job, rest = _job_and_rest(args | changes)
    return megatron_flags(job, **rest)


def _titan(**changes: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(pp=4, v=1, placement="loop", mbs=2, layers=[8, 9, 8, 7],
                                n_layers=32, schedule_csv=None, schedule_name="1F1B")  # fmt: skip
    job, rest = _job_and_rest(args | changes)
    return torchtitan_config(job, **rest)


def _value(flags: list[str], flag: str) -> str | None:
    return flags[flags.index(flag) + 1] if flag in flags else None


# ---------------------------------------------------------------- Megatron-LM


def test_megatron_even_split_needs_no_split_flag() -> None:
    assert _megatron() == [
        "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "4",
        "--num-layers", "32", "--micro-batch-size", "1", "--global-batch-size", "16",
    ]  # fmt: skip


def test_megatron_shards_the_data_parallel_state_as_the_job_does() -> None:
    """Replicated is Megatron-LM's default; a sharded optimizer (the job's, or the
    distributed optimizer a megatron-core stack always runs) and FSDP are flags."""
    assert "--use-distributed-optimizer" not in _megatron(dp=4)
    assert "--use-distributed-optimizer" in _megatron(dp=4, optimizer_sharding=True)
    assert "--use-distributed-optimizer" in _megatron(dp=4, stack="megatron-core")
    assert "--use-distributed-optimizer" not in _megatron(stack="megatron-core")  # dp 1
    fsdp = _megatron(dp=4, dp_shard=4)
    assert "--use-megatron-fsdp" in fsdp and "--use-distributed-optimizer" not in fsdp
    # Megatron-LM core_v0.16.1 defaults the sharding strategy to no_shard and asserts the
    # fsdp_dtensor checkpoint format with Megatron-FSDP (arguments.py:2307, 690)
    assert _value(fsdp, "--data-parallel-sharding-strategy") == "optim_grads_params"
    assert _value(fsdp, "--ckpt-format") == "fsdp_dtensor"
    assert "--num-distributed-optimizer-instances" not in fsdp
    hsdp = _megatron(dp=4, dp_shard=2)  # two replicas of a 2-way shard group
    assert _value(hsdp, "--num-distributed-optimizer-instances") == "2"
    assert _value(hsdp, "--data-parallel-sharding-strategy") == "optim_grads_params"


def test_megatron_even_interleaved_split() -> None:
    flags = _megatron(tp=2, v=2, layers=[4] * 8, recompute=True)
    assert _value(flags, "--num-layers-per-virtual-pipeline-stage") == "4"
    assert _value(flags, "--tensor-model-parallel-size") == "2"
    assert _value(flags, "--recompute-granularity") == "full"
    assert _value(flags, "--recompute-method") == "uniform"
    assert "--pipeline-model-parallel-layout" not in flags


def test_megatron_recompute_follows_the_job_checkpointing() -> None:
    """The job's activation checkpointing gives Megatron-LM's recompute flags (a plan of
    ``--ac full`` printed none before, so Megatron-LM would have kept every activation)."""
    full = _megatron(ac="full")
    assert full[-6:] == ["--recompute-granularity", "full", "--recompute-method", "uniform",
                         "--recompute-num-layers", "1"]  # fmt: skip
    assert _megatron(ac="selective")[-2:] == [
        "--recompute-granularity", "selective"]  # fmt: skip
    block = _megatron(full_layers=(2, 2, 2, 2))
    assert block[-6:] == ["--recompute-granularity", "full", "--recompute-method", "block",
                          "--recompute-num-layers", "2"]  # fmt: skip
    assert "--recompute-granularity" not in _megatron()
    for changes, field in (
        (dict(ac="selective_op"), "ac"),
        (dict(full_layers=(2, 1, 2, 2)), "full_layers"),
        (dict(full_layers=(2, 2, 2, 2), ac="selective"), "full_layers"),
    ):
        with pytest.raises(ProblemError) as err:
            _megatron(**changes)
        assert err.value.field == field


@pytest.mark.parametrize(
    ("layers", "first", "last"),
    [
        ([9, 8, 8, 7], "9", "7"),
        ([7, 8, 8, 8], "7", None),
        ([8, 8, 8, 7], None, "7"),
        ([20, 12], "20", None),
    ],  # fmt: skip
)
def test_megatron_uneven_first_and_last(
    layers: list[int], first: str | None, last: str | None
) -> None:
    flags = _megatron(pp=len(layers), layers=layers, n_layers=sum(layers))
    assert _value(flags, "--decoder-first-pipeline-num-layers") == first
    assert _value(flags, "--decoder-last-pipeline-num-layers") == last
    assert "--pipeline-model-parallel-layout" not in flags


def test_megatron_other_splits_are_a_layout() -> None:
    flags = _megatron(layers=[8, 9, 7, 8])
    assert _value(flags, "--pipeline-model-parallel-layout") == "Et*8|t*9|t*7|t*8L"
    interleaved = _megatron(v=2, layers=[3, 4, 4, 4, 4, 4, 4, 5])
    assert _value(interleaved, "--pipeline-model-parallel-layout") == (
        "Et*3|t*4|t*4|t*4|t*4|t*4|t*4|t*5L"
    )
    assert "--num-layers-per-virtual-pipeline-stage" not in interleaved
    assert pipeline_layout([1, 0, 2]) == "Et||t*2L"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (dict(placement="v", v=2, layers=[4] * 8), "placement"),
        (dict(layers=[8, 8, 8]), "layers"),
        (dict(layers=[8, 8, 8, 9]), "layers"),
        (dict(layers=[8, 8, -8, 24]), "layers"),
        (dict(global_batch=15, mbs=2), "global_batch"),
        (dict(tp=0), "tp"),
        (dict(pp=1, v=2, layers=[16, 16]), "v"),
        (dict(placement="zigzag"), "placement"),
    ],
)
def test_megatron_bad_input_names_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ProblemError) as err:
        _megatron(**changes)
    assert err.value.field == field


# ---------------------------------------------------------------- torchtitan


def test_torchtitan_named_schedule_with_uneven_split() -> None:
    config = _titan()
    assert config["pipeline_parallel_degree"] == 4
    assert config["pipeline_parallel_schedule"] == "1F1B"
    assert config["pipeline_parallel_microbatch_size"] == 2
    assert "pipeline_parallel_schedule_csv" not in config
    parts = config["module_fqns_per_model_part"]
    assert parts[0] == ["tok_embeddings"] + [f"layers.{i}" for i in range(8)]
    assert parts[1] == [f"layers.{i}" for i in range(8, 17)]
    assert parts[3] == [f"layers.{i}" for i in range(25, 32)] + ["norm", "lm_head"]


def test_torchtitan_csv_on_each_placement() -> None:
    loop = _titan(v=2, layers=[4] * 8, schedule_csv="best.csv", schedule_name=None)
    assert loop["pipeline_parallel_schedule"] == "PipelineScheduleMulti"
    one = _titan(schedule_csv="best.csv", schedule_name=None)
    assert one["pipeline_parallel_schedule"] == "PipelineScheduleSingle"
    assert loop["pipeline_parallel_schedule_csv"] == "best.csv"
    # torchtitan places stages V-style only for the V schedules' names.
    v = _titan(v=2, placement="v", layers=[4] * 8, schedule_csv="best.csv", schedule_name=None)
    assert v["pipeline_parallel_schedule"] == "ZBVZeroBubble"
    assert len(v["module_fqns_per_model_part"]) == 8
    assert v["module_fqns_per_model_part"][7][-2:] == ["norm", "lm_head"]
    named = _titan(v=2, placement="v", layers=[4] * 8, schedule_name="DualPipeV")
    assert named["pipeline_parallel_schedule"] == "DualPipeV"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (dict(schedule_name=None), "schedule_name"),
        (dict(schedule_name="ZB-V"), "schedule_name"),
        (dict(schedule_name="ZBVZeroBubble"), "schedule_name"),  # needs the v placement
        (
            dict(placement="v", v=2, layers=[4] * 8, schedule_name="Interleaved1F1B"),
            "schedule_name",
        ),  # fmt: skip
        (dict(v=2, layers=[4] * 8, schedule_name="1F1B"), "schedule_name"),
        (dict(placement="v", v=3, layers=[8, 9, 8, 7]), "v"),  # a Job lifts v = 1 to 2
        (dict(layers=[8, 9, 8]), "layers"),
        (dict(n_layers=31), "layers"),
        (dict(mbs=0), "mbs"),
        (dict(schedule_csv=" "), "schedule_csv"),
        (dict(schedule_csv="best.csv", schedule_name="_PipelineScheduleRuntime"), "schedule_name"),
        (dict(schedule_name="PipelineScheduleMulti"), "schedule_name"),  # needs a CSV
        (dict(version="0.2"), "torchtitan"),
    ],
)
def test_torchtitan_bad_input_names_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ProblemError) as err:
        _titan(**changes)
    assert err.value.field == field


# ---------------------------------------------------------------- default splits


def test_default_splits() -> None:
    from pp_opt.frameworks.megatron import default_layers as megatron_default_layers
    from pp_opt.frameworks.torchtitan import default_layers as torchtitan_default_layers

    assert torchtitan_default_layers(32, 4) == (8, 9, 8, 7)  # the example
    assert torchtitan_default_layers(126, 16) == (7,) + (8,) * 14 + (7,)
    assert torchtitan_default_layers(32, 8) == (4, 5, 4, 4, 4, 4, 4, 3)
    assert torchtitan_default_layers(22, 4) == (5, 6, 6, 5)
    assert torchtitan_default_layers(32, 1) == (32,)
    assert sum(torchtitan_default_layers(80, 10)) == 80
    assert megatron_default_layers(32, 4) == (8,) * 4
    with pytest.raises(ProblemError) as err:
        megatron_default_layers(126, 16)
    assert err.value.field == "stages"
    with pytest.raises(ProblemError) as err:
        torchtitan_default_layers(2, 8)
    assert err.value.field == "stages"
