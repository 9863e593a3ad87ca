"""``pp-opt predict``: one fully pinned configuration in, its predicted step time out."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from pp_opt.atomic import check_writable
from pp_opt.cli.common import LayersOption, layers_per_stage
from pp_opt.cli.output import show_and_write

if TYPE_CHECKING:
    from pp_opt.planner.predict import Prediction


def predict(
    model: str = typer.Option(..., "--model", help="Model card TOML (or bundled name)."),
    hardware: str = typer.Option(..., "--hardware", help="Hardware card TOML (or name)."),
    gpus: int = typer.Option(..., "--gpus", help="GPUs: tp x pp x cp x dp-shard x dp-replicate."),
    global_batch: int = typer.Option(..., "--global-batch", help="Sequences per step."),
    seq: int = typer.Option(..., "--seq", help="Sequence length."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel degree (1: no pipeline)."),
    cp: int = typer.Option(1, "--cp", help="Context-parallel degree (ring attention)."),
    dp_shard: int = typer.Option(1, "--dp-shard", help="FSDP shard degree."),
    dp_replicate: int = typer.Option(1, "--dp-replicate", help="Replicas of each shard group."),
    mbs: int = typer.Option(1, "--mbs", help="Sequences per microbatch."),
    schedule: str = typer.Option(
        "pp_opt",
        "--schedule",
        help="pp_opt (solved) or a PyTorch schedule name (1F1B, Interleaved1F1B, ...).",
    ),  # fmt: skip
    v: int | None = typer.Option(None, "--v", help="Stages per rank (default 1; 2 interleaved)."),
    placement: str = typer.Option("loop", "--placement", help="loop or v."),
    layers: str | None = LayersOption,
    ac: str = typer.Option("none", "--ac", help="none, selective, selective_op or full."),
    fp8: bool = typer.Option(False, "--fp8", help="Float8 linear layers."),
    compile: bool = typer.Option(False, "--compile", help="torch.compile each layer."),
    async_tp: bool = typer.Option(False, "--async-tp", help="Overlap TP collectives (compile)."),
    time_limit: float = typer.Option(10.0, "--time-limit", help="Seconds for the solve."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write the prediction JSON."),
) -> None:
    """Predict one configuration's step time, TPS/GPU, MFU and peak memory per pipeline rank."""
    from pp_opt.planner.predict import predict as run

    if output is not None:
        check_writable(output)
    split = layers_per_stage(layers)
    got = run(
        model=model, hardware=hardware, gpus=gpus, global_batch=global_batch, seq=seq, tp=tp,
        pp=pp, cp=cp, dp_shard=dp_shard, dp_replicate=dp_replicate, mbs=mbs, schedule=schedule,
        v=v, placement=placement, layers=None if split is None else tuple(split), ac=ac,
        fp8=fp8, compile=compile, async_tp=async_tp, time_limit=time_limit,
    )  # fmt: skip
    show_and_write(prediction_table(got), got.to_dict(), output)


def prediction_table(got: Prediction) -> str:
    """The short table ``pp-opt predict`` prints, with the peak's named terms per rank."""
    from pp_opt.profiler.memory_breakdown import breakdown_table

    gap = "-" if got.gap is None else f"{got.gap:.1%}"
    rows = [f"config        {' '.join(f'{k}={v}' for k, v in got.config.items())}",
            f"schedule      {got.schedule} ({got.status}, gap {gap})"]  # fmt: skip
    if got.step_time is None or got.tokens_per_s_per_gpu is None or got.mfu is None:
        rows.append(f"no schedule   {got.note}")
        return "\n".join(rows)
    gib = " ".join(f"{x / 2**30:.1f}" for x in got.peak_memory)
    rows += [f"step time     {got.step_time:.1f} ms",
             f"TPS/GPU       {got.tokens_per_s_per_gpu:.1f}", f"MFU           {got.mfu:.1%}",
             f"peak memory   {gib} GiB per pipeline rank"]  # fmt: skip
    if got.memory_breakdown:
        rows += ["memory breakdown (reserved: what torchtitan reports; allocated: Megatron-Core)",
                 breakdown_table(got.memory_breakdown)]  # fmt: skip
    return "\n".join(rows)


def register(app: typer.Typer) -> None:
    app.command()(predict)
