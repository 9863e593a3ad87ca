"""From a real decoder model to a profiled problem, a solved schedule and a timed run.

Two steps. ``plan`` profiles a small GPT-style decoder with PyTorch (every stage's forward,
PyTorch's own input/weight backward split and its fused backward, all devices at once),
turns the profile into a problem, solves it and writes the schedule; it prints the
command for step two. ``run`` trains on that schedule with PyTorch's pipeline runtime on
as many processes as the schedule has devices (gloo on CPU, NCCL with one GPU per rank on
CUDA) and prints, per step, the predicted iteration time next to the measured one::

    python examples/pipeline_decoder.py plan --pp 2 -o run/
    torchrun --nproc-per-node 2 examples/pipeline_decoder.py run run/schedule.json --steps 10

(``--nproc-per-node`` must equal ``--pp``; ``plan`` prints the exact command.) The schedule
JSON carries the model card and the layer split it was profiled for, so ``run`` rebuilds
the same stages from it. A step's measured iteration time is the slowest rank's
``pipe.step`` (forward, backward, sends and receives; all ranks start at a barrier), which
the schedule's makespan predicts; the optimizer step is timed and reported separately.
The first ``--warmup-steps`` steps are printed but left out of the summary.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from pp_opt.profiler.cards import load_model_card, model_card_from_dict

SMALL_DECODER = dict(layers=4, hidden=256, heads=4, vocab=2048, seq=128, dtype="fp32")
"""A GPT-style decoder (learned positions, LayerNorm, GeLU, eager attention) that trains on a
CPU in seconds; ``--model`` takes any model card instead."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="profile the model, solve, write the schedule")
    plan.add_argument("--model", default=None, help="model card (default: a small decoder)")
    hardware = "hardware card: cap and links (default on a CPU: cpu; give one on CUDA)"
    plan.add_argument("--hardware", default=None, help=hardware)
    plan.add_argument("--pp", type=int, default=2, help="pipeline devices (processes)")
    plan.add_argument("-m", "--microbatches", type=int, default=8)
    plan.add_argument("--mbs", type=int, default=1, help="sequences per microbatch")
    names = "cpsat, cpsat-fused, a baseline (1f1b, zb-h1, ...), or <name>-offload"
    plan.add_argument("--schedule", default="cpsat", help=names)
    plan.add_argument("--time-limit", type=float, default=10.0, help="solver seconds")
    plan.add_argument("--repeats", type=int, default=20, help="timed runs per op")
    plan.add_argument("--warmup", type=int, default=3, help="untimed runs per op first")
    plan.add_argument("-o", "--output", type=Path, default=Path("run"), help="output folder")
    run = sub.add_parser("run", help="train on a schedule under torchrun, timed")
    run.add_argument("schedule", type=Path, help="schedule JSON written by `plan`")
    run.add_argument("--steps", type=int, default=10, help="training steps, warm-up included")
    run.add_argument("--warmup-steps", type=int, default=3, help="steps left out of the summary")
    run.add_argument("--lr", type=float, default=1e-3)
    return parser.parse_args(argv)


def plan(args: argparse.Namespace) -> None:
    import json

    from pp_opt.problem_io import problem_from_costs
    from pp_opt.profiler import profile_costs
    from pp_opt.profiler.costs import costs_table
    from pp_opt.runtime.plans import plan_schedule
    from pp_opt.schedule_io import save_schedule

    card = (
        load_model_card(args.model)
        if args.model
        else model_card_from_dict(SMALL_DECODER, "small-decoder")
    )
    threads = 1 if torch.cuda.is_available() else max(1, (os.cpu_count() or 1) // args.pp)
    costs = profile_costs(model=card, hardware=args.hardware, pp=args.pp,
                          microbatches=args.microbatches, mbs=args.mbs, measure=True,
                          repeats=args.repeats, warmup=args.warmup,
                          threads=threads, concurrent=True)  # fmt: skip
    print(costs_table(costs))
    schedule = plan_schedule(problem_from_costs(costs), args.schedule, time_limit=args.time_limit)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "costs.json").write_text(json.dumps(costs, indent=1) + "\n")
    save_schedule(schedule, args.output / "schedule.json")
    p = schedule.problem.p
    made_by = schedule.solver.name if schedule.solver else "?"
    predicted = schedule.metrics.makespan
    print(f"\n{args.schedule} ({made_by}): predicted iteration {predicted:.1f} ms")
    print(f"wrote {args.output}/costs.json and {args.output}/schedule.json")
    print(f"next: torchrun --nproc-per-node {p} {sys.argv[0]} run {args.output / 'schedule.json'}")


def run(args: argparse.Namespace) -> None:
    from pp_opt.profiler.torch.model import make_batch
    from pp_opt.runtime.timed_run import (
        build_decoder_pipeline,
        gather_step_times,
        time_steps,
    )
    from pp_opt.schedule_io import load_schedule

    schedule = load_schedule(args.schedule)
    problem = schedule.problem
    world = int(os.environ.get("WORLD_SIZE", "1"))  # set by torchrun
    if world != problem.p:
        raise SystemExit(f"{args.schedule} is a schedule for {problem.p} devices but "
                         f"{world} processes were started; launch it with "
                         f"torchrun --nproc-per-node {problem.p}")  # fmt: skip
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    try:
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        else:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        profile = problem.extra["profile"]
        card = model_card_from_dict(profile["model"], profile["model"]["name"])
        dtype = profile.get("environment", {}).get("dtype", "float32")
        dtype = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[dtype]
        pipe, modules = build_decoder_pipeline(
            schedule, card, rank=rank, device=device, dtype=dtype
        )
        optimizer = torch.optim.AdamW([p for m in modules for p in m.parameters()], lr=args.lr)
        batch = make_batch(card, rows=problem.m * profile["layout"]["mbs"], seq=card.seq,
                           device=device)  # fmt: skip
        times = time_steps(pipe, modules, batch, steps=args.steps, optimizer=optimizer)
        every = gather_step_times(times)
        if rank == 0:
            report(schedule.metrics.makespan, every, args.warmup_steps)
    finally:
        dist.destroy_process_group()


def report(predicted: float, every: list, warmup: int) -> None:
    from pp_opt.runtime.timed_run import summarize

    losses = next((t.losses for t in every if t.losses), [])
    print(f"{'step':>4} {'predicted':>9} {'measured':>9} {'ratio':>6} {'optimizer':>9} {'loss':>8}"
          "  per-rank pipeline ms")  # fmt: skip
    for i in range(len(every[0].pipeline)):
        measured = max(t.pipeline[i] for t in every)
        ranks = " ".join(f"{t.pipeline[i]:.1f}" for t in every)
        opt = max(t.optimizer[i] for t in every)
        tag = " (warm-up)" if i < warmup else ""
        loss = f"{losses[i]:8.4f}" if i < len(losses) else " " * 8
        print(f"{i:>4} {predicted:9.1f} {measured:9.1f} {predicted / measured:6.3f} {opt:9.1f} "
              f"{loss}  {ranks}{tag}")  # fmt: skip
    summary = summarize(every, warmup=warmup)
    it = summary["iteration"]
    optimizer = max(r["optimizer"]["median"] for r in summary["ranks"])
    print(f"after {warmup} warm-up steps: measured {it['median']:.1f} ms median "
          f"(iqr {it['iqr']:.1f}), predicted {predicted:.1f} ms: "
          f"predicted/measured {predicted / it['median']:.3f}; optimizer step "
          f"{optimizer:.1f} ms, not in either")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    plan(args) if args.command == "plan" else run(args)


if __name__ == "__main__":
    main()
