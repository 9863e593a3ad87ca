"""Train a toy model with any pp_opt schedule on PyTorch's pipeline runtime.

Make a schedule, then run it on as many processes as it has devices (``examples/small.toml``
has p = 4, so 4 processes)::

    pp-opt solve examples/small.toml -o schedule.json
    torchrun --nproc-per-node 4 examples/torchrun_train.py schedule.json --steps 5

Each rank builds the stages the schedule places on it (``schedule.problem.stages_on``),
wraps them in ``PipelineStage``, and calls ``pipe.step`` like any PyTorch
pipeline schedule; OFFLOAD/RELOAD ops in the schedule move saved activations to
host memory and back. Uses NCCL on CUDA (one GPU per rank) and gloo on CPU.

The model is a stack of ``num_stages`` chunks of Linear-GELU-Linear, the same on
every rank (same seed), so the run is reproducible; swap in your own chunks. Rank 0 prints
every step's loss, each rank's pipeline time and the optimizer time (ranks start each step
together; the first ``--warmup-steps`` are marked and left out of the summary).
``small.toml`` has unitless costs, so there is no prediction in ms to compare with: for
predicted against measured times on a real decoder, see ``examples/pipeline_decoder.py``.
"""

from __future__ import annotations

import argparse
import logging
import os

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage

from pp_opt.runtime import build_pipeline_schedule
from pp_opt.runtime.timed_run import gather_step_times, summarize, time_steps
from pp_opt.schedule_io import load_schedule


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("schedule", help="schedule JSON written by pp-opt solve / baseline")
    parser.add_argument("--steps", type=int, default=3, help="training steps")
    parser.add_argument("--warmup-steps", type=int, default=1, help="left out of the summary")
    parser.add_argument("--width", type=int, default=64, help="hidden size of the toy model")
    parser.add_argument("--rows", type=int, default=4, help="rows per microbatch")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument(
        "--format",
        default="compute_only",
        choices=("compute_only", "compute_comms"),
        help="compute_only: PyTorch places sends/receives; compute_comms: pp_opt does",
    )
    return parser.parse_args()


def make_chunk(width: int, stage: int, seed: int = 0) -> torch.nn.Module:
    """Chunk ``stage`` of the toy model, identical on every rank."""
    torch.manual_seed(seed + stage)
    return torch.nn.Sequential(
        torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
    )


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING)
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    schedule = load_schedule(args.schedule)
    problem = schedule.problem
    if world != problem.p:
        raise SystemExit(
            f"the schedule is for {problem.p} devices; use --nproc-per-node {problem.p}"
        )

    chunks = {s: make_chunk(args.width, s).to(device) for s in problem.stages_on(rank)}
    stages = [PipelineStage(chunk, s, problem.num_stages, device) for s, chunk in chunks.items()]
    pipe = build_pipeline_schedule(
        schedule, stages, loss_fn=torch.nn.functional.mse_loss, format=args.format
    )
    params = [p for chunk in chunks.values() for p in chunk.parameters()]
    optimizer = torch.optim.SGD(params, lr=args.lr)

    generator = torch.Generator().manual_seed(1234)
    batch = problem.m * args.rows
    x = torch.randn(batch, args.width, generator=generator).to(device)
    y = torch.randn(batch, args.width, generator=generator).to(device)
    # every rank passes the same batch; each step starts at a barrier, pipeline and
    # optimizer step timed apart
    times = time_steps(pipe, list(chunks.values()), (x, y), steps=args.steps, optimizer=optimizer)
    every = gather_step_times(times)
    if rank == 0:
        for step in range(args.steps):
            ranks = " ".join(f"{t.pipeline[step]:.1f}" for t in every)
            opt = max(t.optimizer[step] for t in every)
            losses = next(t.losses for t in every if t.losses)
            tag = " (warm-up)" if step < args.warmup_steps else ""
            print(f"step {step}: loss {losses[step]:.6f}; pipeline ms per rank {ranks}; "
                  f"optimizer {opt:.1f} ms{tag}")  # fmt: skip
        if args.steps > args.warmup_steps:
            it = summarize(every, warmup=args.warmup_steps)["iteration"]
            print(f"iteration (slowest rank, optimizer excluded): {it['median']:.1f} ms median, "
                  f"iqr {it['iqr']:.1f}, over {it['repeats']} steps after warm-up")  # fmt: skip

    offloads = [op for op in schedule.ops if op.kind == "OFFLOAD" and op.stage in chunks]
    if offloads:
        print(f"rank {rank}: {len(offloads)} activations went to host memory and back each step")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
