"""``pp-opt profile`` (stage costs of a model on a GPU at a parallel layout, as cost JSON) and
``pp-opt models`` (the bundled cards)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from pp_opt.atomic import check_writable
from pp_opt.cli.common import VppAlias, chunks_per_device
from pp_opt.cli.job_options import with_job_options
from pp_opt.cli.output import say, show_and_write
from pp_opt.errors import ProblemError


@with_job_options("profile")
def profile(
    model: Path = typer.Option(..., "--model", help="Model card TOML (or bundled name)."),
    hardware: Path | None = typer.Option(
        None, "--hardware", help="Hardware card TOML (or name); 'cpu' by default with --measure."
    ),
    seq: int | None = typer.Option(None, "--seq", help="Sequence length (card default)."),
    vpp: int | None = VppAlias,
    measure: bool = typer.Option(False, "--measure", help="Time PyTorch modules (CUDA/CPU)."),
    repeats: int = typer.Option(10, "--repeats", help="Timed runs per measurement."),
    threads: int | None = typer.Option(None, "--threads", help="Torch CPU threads (measure)."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write the cost JSON."),
    warmup: int = typer.Option(2, "--warmup", help="Untimed runs before timing (measure)."),
    concurrent: bool = typer.Option(
        False, "--concurrent", help="Time all devices' stages at once, as a pipeline runs."
    ),
    job_fields: dict[str, Any] | None = None,
) -> None:
    """Profile per-stage costs (analytic, or measured with --measure) and print them."""
    from pp_opt.profiler import profile_of
    from pp_opt.profiler.costs import costs_table

    if output is not None:
        check_writable(output)
    fields = dict(job_fields or {})
    for name in ("pp", "microbatches"):
        if name not in fields:
            raise ProblemError(name, f"missing; give --{name}")
    fields["v"] = chunks_per_device(fields.get("v"), vpp=vpp) or 1
    card = None if hardware is None else str(hardware)  # None: 'cpu' when measuring on a CPU
    profile = profile_of(
        model=str(model), hardware=card, seq=seq, measure=measure, repeats=repeats,
        threads=threads, warmup=warmup, concurrent=concurrent, **fields,
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
