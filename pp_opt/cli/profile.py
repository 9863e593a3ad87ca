"""``pp-opt profile`` (stage costs of a model on a GPU at a parallel layout, as cost JSON) and
``pp-opt models`` (the bundled cards)."""

from __future__ import annotations

from pathlib import Path

import typer

from pp_opt.atomic import check_writable
from pp_opt.cli.common import LayersOption, VppAlias, chunks_per_device, layers_per_stage
from pp_opt.cli.output import say, show_and_write


def profile(
    model: Path = typer.Option(..., "--model", help="Model card TOML (or bundled name)."),
    hardware: Path | None = typer.Option(
        None, "--hardware", help="Hardware card TOML (or name); 'cpu' by default with --measure."
    ),
    pp: int = typer.Option(..., "--pp", help="Pipeline size (devices)."),
    v: int | None = typer.Option(None, "--v", help="Chunks per device (default 1; v placement 2)."),
    vpp: int | None = VppAlias,
    placement: str = typer.Option("loop", "--placement", help="loop or v (implies --v 2)."),
    microbatches: int = typer.Option(..., "--microbatches", "-m", help="Microbatches."),
    mbs: int = typer.Option(1, "--mbs", help="Microbatch size (sequences)."),
    seq: int | None = typer.Option(None, "--seq", help="Sequence length (card default)."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree (sequence parallel)."),
    layers: str | None = LayersOption,
    recompute: str = typer.Option(
        "none", "--recompute", help="none, selective, selective_op or full (checkpointing)."
    ),
    dp_shard: int = typer.Option(1, "--dp-shard", help="FSDP shard degree."),
    dp_replicate: int = typer.Option(1, "--dp-replicate", help="Replicas of each shard group."),
    cp: int = typer.Option(1, "--cp", help="Context-parallel degree."),
    fp8: bool = typer.Option(False, "--fp8", help="Float8 linear layers."),
    compile: bool = typer.Option(False, "--compile", help="torch.compile each layer."),
    async_tp: bool = typer.Option(False, "--async-tp", help="Overlap TP collectives."),
    bytes_per_param: float = typer.Option(16.0, "--bytes-per-param", help="Static bytes."),
    measure: bool = typer.Option(False, "--measure", help="Time PyTorch modules (CUDA/CPU)."),
    repeats: int = typer.Option(10, "--repeats", help="Timed runs per measurement."),
    threads: int | None = typer.Option(None, "--threads", help="Torch CPU threads (measure)."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write the cost JSON."),
    warmup: int = typer.Option(2, "--warmup", help="Untimed runs before timing (measure)."),
    concurrent: bool = typer.Option(
        False, "--concurrent", help="Time all devices' stages at once, as a pipeline runs."
    ),
) -> None:
    """Profile per-stage costs (analytic, or measured with --measure) and print them."""
    from pp_opt.profiler import profile_of
    from pp_opt.profiler.costs import costs_table

    if output is not None:
        check_writable(output)
    chunks = chunks_per_device(v, vpp=vpp) or 1
    card = None if hardware is None else str(hardware)  # None: 'cpu' when measuring on a CPU
    profile = profile_of(
        model=str(model), hardware=card, pp=pp, v=chunks, placement=placement,
        microbatches=microbatches, mbs=mbs, seq=seq, tp=tp, layers=layers_per_stage(layers),
        measure=measure, recompute=recompute, bytes_per_param=bytes_per_param, repeats=repeats,
        threads=threads, warmup=warmup, concurrent=concurrent, dp_shard=dp_shard,
        dp_replicate=dp_replicate, cp=cp, fp8=fp8, compile=compile, async_tp=async_tp,
    )  # fmt: skip
    data = profile.to_dict()
    show_and_write(costs_table(data), data, output)


def models() -> None:
    """List the bundled model and hardware cards (use their names with --model/--hardware)."""
    from pp_opt.card_files import card_infos

    infos = card_infos()
    width = max(len(info.name) for info in infos)
    for info in infos:
        say(f"{info.name:<{width}}  {info.kind:<8}  {info.description}")


def register(app: typer.Typer) -> None:
    app.command()(profile)
    app.command()(models)
