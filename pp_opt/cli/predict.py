"""``pp-opt predict``: one fully pinned configuration in, its predicted step time out."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from pp_opt.atomic import check_writable
from pp_opt.cli import exit_codes
from pp_opt.cli.job_options import with_job_options
from pp_opt.cli.output import show_and_write

if TYPE_CHECKING:
    from pp_opt.planner.predict import Prediction


@with_job_options("predict")
def predict(
    model: str = typer.Option(..., "--model", help="Model card TOML (or bundled name)."),
    hardware: str = typer.Option(..., "--hardware", help="Hardware card TOML (or name)."),
    gpus: int = typer.Option(
        ...,
        "--gpus",
        help="GPUs: tp x pp x cp x dp-shard x dp-replicate (a data-parallel "
        "degree left out takes the ranks the others leave).",
    ),
    global_batch: int = typer.Option(..., "--global-batch", help="Sequences per step."),
    seq: int = typer.Option(..., "--seq", help="Sequence length."),
    schedule: str = typer.Option(
        "pp_opt",
        "--schedule",
        help="pp_opt (solved) or a PyTorch schedule name (1F1B, Interleaved1F1B, ...).",
    ),  # fmt: skip
    time_limit: float = typer.Option(10.0, "--time-limit", help="Seconds for the solve."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write the prediction JSON."),
    job_fields: dict[str, Any] | None = None,
) -> None:
    """Predict one configuration's step time, TPS/GPU, MFU and peak memory per pipeline rank.

    A configuration that does not fit exits 2 (a solve that found no schedule in time, 3;
    one the cost model refuses, 1) after printing why and writing the prediction."""
    from pp_opt.planner.predict import predict as run

    if output is not None:
        check_writable(output)
    got = run(model=model, hardware=hardware, gpus=gpus, global_batch=global_batch, seq=seq,
              schedule=schedule, time_limit=time_limit, **(job_fields or {}))  # fmt: skip
    show_and_write(prediction_table(got), got.to_dict(), output)
    failed = {"infeasible": exit_codes.INFEASIBLE, "timeout": exit_codes.TIME_LIMIT,
              "error": exit_codes.BAD_INPUT}  # fmt: skip
    if got.status in failed:
        raise typer.Exit(failed[got.status])


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
