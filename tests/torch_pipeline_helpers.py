"""Helpers of the PyTorch tests: hand-made op orders, a small model, and the
per-rank worker that runs schedules with pp_opt.runtime and checks them against
the same model trained without pipelining."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

from order_helpers import timed

from pp_opt.dag import build_dag
from pp_opt.ops import OpKey, OpKind, Stream, duration, stream_of
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule

WIDTH = 6
MICROBATCH_ROWS = 2


# ---------------------------------------------------------------- op orders


def greedy_order(
    problem: Problem, *, split: bool, defer_w: bool = False, inflight: int | None = None
) -> dict[tuple[int, Stream], list[OpKey]]:
    """A list-scheduled compute order: backward first, then forward (at most
    ``inflight`` microbatches per device waiting for their backward), then ``W``
    (last of all when ``defer_w``, the zero-bubble style)."""
    dag = build_dag(problem, split_backward=split, offload=False, recompute=False)
    limit = inflight or problem.num_stages
    prio = {OpKind.B: 0, OpKind.BW: 0, OpKind.W: 2 if defer_w else 0, OpKind.F: 1}
    end: dict[OpKey, float] = {}
    free = [0.0] * problem.p
    open_f = [0] * problem.p
    order: dict[tuple[int, Stream], list[OpKey]] = {}
    todo = set(dag.nodes)
    while todo:
        best = None
        for relax in (False, True):
            for key in todo:
                if any(u not in end for u in dag.predecessors(key)):
                    continue
                d = problem.device_of(key.stage)
                if key.kind is OpKind.F and open_f[d] >= limit and not relax:
                    continue
                ready = max([free[d]] + [end[u] + dag.edges[u, key]["latency"]
                                         for u in dag.predecessors(key)])  # fmt: skip
                rank = (ready, prio[key.kind], key.microbatch, key.stage)
                if best is None or rank < best[0]:
                    best = (rank, key)
            if best is not None:
                break
        assert best is not None
        (start, *_), key = best
        d = problem.device_of(key.stage)
        end[key] = start + duration(problem, key.kind, key.stage)
        free[d] = end[key]
        open_f[d] += 1 if key.kind is OpKind.F else -1 if key.kind in (OpKind.B, OpKind.BW) else 0
        order.setdefault((d, Stream.COMPUTE), []).append(key)
        todo.remove(key)
    return order


def with_offload(
    problem: Problem,
    order: dict[tuple[int, Stream], list[OpKey]],
    pairs: Iterable[tuple[int, int]],
) -> dict[tuple[int, Stream], list[OpKey]]:
    """Add OFFLOAD (in forward order) and RELOAD (in backward order) for ``pairs``."""
    pairs = set(pairs)
    out = {k: list(v) for k, v in order.items()}
    for (d, stream), keys in order.items():
        assert stream is Stream.COMPUTE
        for key in keys:
            if (key.stage, key.microbatch) not in pairs:
                continue
            if key.kind is OpKind.F:
                copy = OpKey(OpKind.OFFLOAD, key.stage, key.microbatch)
            elif key.kind in (OpKind.B, OpKind.BW):
                copy = OpKey(OpKind.RELOAD, key.stage, key.microbatch)
            else:
                continue
            out.setdefault((d, stream_of(copy.kind)), []).append(copy)
    return out


def uneven_problem(m: int = 4) -> Problem:
    """Explicit placement, p = 2: stages 0 and 1 on device 0, stage 2 on device 1."""
    from pp_opt.problem import Device, Stage

    stages = tuple(Stage(device=d, t_f=1.0, t_b=1.0, t_w=1.0) for d in (0, 0, 1))
    devices = (Device(cap=8.0), Device(cap=8.0))
    return Problem(p=2, m=m, stages=stages, devices=devices, placement="explicit", t_comm=0.1)


def make_schedule(
    problem: Problem,
    *,
    split: bool,
    defer_w: bool = False,
    inflight: int | None = None,
    offload: Iterable[tuple[int, int]] = (),
) -> Schedule:
    order = greedy_order(problem, split=split, defer_w=defer_w, inflight=inflight)
    offload = list(offload)
    if offload:
        order = with_offload(problem, order, offload)
    return timed(problem, order)


# ---------------------------------------------------------------- the model


def make_model(num_stages: int, seed: int):  # -> torch.nn.Sequential
    """``num_stages`` chunks of Linear-Tanh-Linear-Tanh, float64, seeded."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    chunks = []
    for _ in range(num_stages):
        layers = []
        for _ in range(2):
            lin = torch.nn.Linear(WIDTH, WIDTH, dtype=torch.float64)
            with torch.no_grad():
                lin.weight.copy_(torch.randn(WIDTH, WIDTH, generator=gen, dtype=torch.float64))
                lin.bias.copy_(torch.randn(WIDTH, generator=gen, dtype=torch.float64) * 0.1)
            layers += [lin, torch.nn.Tanh()]
        chunks.append(torch.nn.Sequential(*layers))
    return torch.nn.Sequential(*chunks)


def make_batch(m: int, seed: int):
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(m * MICROBATCH_ROWS, WIDTH, generator=gen, dtype=torch.float64)
    y = torch.randn(m * MICROBATCH_ROWS, WIDTH, generator=gen, dtype=torch.float64)
    return x, y


def reference(model, x, y, m: int):
    """Losses per microbatch and gradients of the unpipelined model (mean over microbatches)."""
    import torch

    losses = []
    for xj, yj in zip(x.chunk(m), y.chunk(m), strict=True):
        losses.append(torch.nn.functional.mse_loss(model(xj), yj))
    (torch.stack(losses).sum() / m).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return [v.item() for v in losses], grads


# ---------------------------------------------------------------- per-rank worker


def worker(rank: int, world: int, port: int, cases_path: str, out_dir: str) -> None:
    """Entry point of each spawned rank: run every case, write ``rank{r}.json``."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = []
    try:
        for case in json.loads(Path(cases_path).read_text()):
            start = time.perf_counter()
            results.append(run_case(rank, case))
            dist.barrier()
            results[-1]["seconds"] = time.perf_counter() - start
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
        dist.destroy_process_group()


def run_case(rank: int, case: dict) -> dict:
    """Run one schedule twice (a second step must give the same answer) and compare."""
    import copy

    import torch
    from torch.distributed.pipelining import PipelineStage

    from pp_opt.runtime import build_pipeline_schedule
    from pp_opt.schedule_io import loads_schedule

    schedule = loads_schedule(case["schedule"])
    problem = schedule.problem
    model = make_model(problem.num_stages, seed=case.get("seed", 0))
    x, y = make_batch(problem.m, seed=case.get("seed", 0))
    ref_losses, ref_grads = reference(copy.deepcopy(model), x, y, problem.m)
    mine = problem.stages_on(rank)
    chunks = {s: copy.deepcopy(model[s]) for s in mine}
    stages = [PipelineStage(chunks[s], s, problem.num_stages, torch.device("cpu")) for s in mine]
    pipe = build_pipeline_schedule(
        schedule,
        stages,
        loss_fn=torch.nn.functional.mse_loss,
        format=case["format"],
        record_offload=True,
    )
    grad_err, loss_err, steps = 0.0, 0.0, []
    for _ in range(2):
        for chunk in chunks.values():
            chunk.zero_grad(set_to_none=True)
        losses: list = []
        pipe.step(x, target=y, losses=losses)
        for s in mine:
            for name, p in chunks[s].named_parameters():
                grad_err = max(grad_err, float((p.grad - ref_grads[f"{s}.{name}"]).abs().max()))
        if problem.num_stages - 1 in mine:
            got = [float(v.detach()) for v in losses]
            loss_err = max(loss_err, max(abs(a - b) for a, b in zip(got, ref_losses, strict=True)))
        events = pipe.offloader.events if pipe.offloader is not None else []
        steps.append([_event_dict(e) for e in events])
        if pipe.offloader is not None:
            pipe.offloader.events.clear()
    return {
        "name": case["name"],
        "rank": rank,
        "grad_err": grad_err,
        "loss_err": loss_err,
        "has_last": problem.num_stages - 1 in mine,
        "offload_events": steps,
    }


def _event_dict(event) -> dict:
    return {
        "action": event.action,
        "stage": event.stage,
        "microbatch": event.microbatch,
        "tensors": event.tensors,
        "freed": event.freed,
        "locations": list(event.locations),
    }


# ---------------------------------------------------------------- decoder pipelines (fidelity)


def decoder_worker(rank: int, world: int, port: int, job_path: str, out_dir: str) -> None:
    """One rank of the decoder tests: gradients against the unpipelined decoder, then a
    timed interleaved comparison of the schedules; writes ``rank{r}.json``."""
    import torch
    import torch.distributed as dist

    from pp_opt.profiler.cards import model_card_from_dict
    from pp_opt.profiler.torch.model import make_batch
    from pp_opt.runtime.timed_run import compare_schedules
    from pp_opt.schedule_io import loads_schedule

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    job = json.loads(Path(job_path).read_text())
    out: dict = {}
    try:
        card = model_card_from_dict(job["card"], "tiny")
        schedules = {name: loads_schedule(text) for name, text in job["schedules"].items()}
        problem = next(iter(schedules.values())).problem
        batch = make_batch(card, rows=problem.m, seq=card.seq)
        out["grad_err"] = {
            name: decoder_grad_error(schedule, card, batch, rank)
            for name, schedule in schedules.items()
        }
        out["compare"], out["profiles"] = compare_schedules(
            schedules, card, batch, rank=rank, device=torch.device("cpu"), rounds=2, steps=1,
            warmup=1, profile_repeats=2,
        )  # fmt: skip
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
        dist.destroy_process_group()


def decoder_grad_error(schedule: Schedule, card, batch, rank: int) -> float:
    """Largest relative gradient difference of this rank's stages against the same decoder
    run without pipelining (mean loss over the microbatches)."""
    import torch

    from pp_opt.profiler.torch.model import lm_loss, make_stage
    from pp_opt.runtime.timed_run import build_decoder_pipeline, stage_layers

    problem = schedule.problem
    layers = stage_layers(schedule)
    full = [make_stage(card, layers, s) for s in range(problem.num_stages)]
    ids, targets = batch
    total = 0.0
    for x, y in zip(ids.chunk(problem.m), targets.chunk(problem.m), strict=True):
        h = x
        for module in full:
            h = module(h)
        total = total + lm_loss(h, y)
    (total / problem.m).backward()
    pipe, modules = build_decoder_pipeline(schedule, card, rank=rank, device=torch.device("cpu"))
    pipe.step(ids, target=targets, return_outputs=False)
    err = 0.0
    for s, module in zip(problem.stages_on(rank), modules, strict=True):
        for mine, ref in zip(module.parameters(), full[s].parameters(), strict=True):
            scale = float(ref.grad.abs().max()) or 1.0
            err = max(err, float((mine.grad - ref.grad).abs().max()) / scale)
    return err
