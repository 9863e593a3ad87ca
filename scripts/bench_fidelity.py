"""Do predictions hold when the schedule runs? Predicted vs measured iteration time.

For a small real decoder: profile it with PyTorch (every stage's F, I, W, B as the
pipeline runtime runs them; by default all devices at once), solve and build a few
schedules on that profile, then run each one on ``--pp`` processes through PyTorch's
pipeline runtime (gloo on CPU, NCCL with one GPU per rank on CUDA) in interleaved rounds.
Per schedule: the predicted makespan, the measured iteration time (slowest rank's
``pipe.step``, optimizer step excluded; median and interquartile range over the timed
steps, warm-up steps excluded), their ratio, and whether the predicted ranking of the
solver against 1F1B and ZB-H1 holds in the medians and in how many rounds. The machine
load during the run is printed with the table; numbers from a busy machine say little.

    .venv/bin/python scripts/bench_fidelity.py                 # p=2, m=8: ~1 minute on 2 cores
    .venv/bin/python scripts/bench_fidelity.py -m 2 --json fidelity.json

On 2 CPU cores with p=2 and m=8 the three ranked schedules are predicted within ~2% of each
other (PyTorch's I + W costs more than its fused B, so the split buys little), which the
run's noise can hide; with m=2 the bubbles weigh more and ZB-H1 (and the solver) are
predicted ~10% faster than 1F1B, a ranking the measurement can confirm or refute.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from itertools import combinations
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pp_opt.errors import ProblemError
from pp_opt.problem_io import problem_from_costs
from pp_opt.profiler import profile_costs
from pp_opt.profiler.cards import model_card_from_dict
from pp_opt.profiler.costs import costs_table
from pp_opt.profiler.torch.machine_load import LoadMonitor, describe
from pp_opt.runtime.plans import OFFLOAD_SUFFIX, plan_schedules, with_measured_times, with_offload
from pp_opt.schedule_io import dumps_schedule, loads_schedule

RANKED = ("cpsat", "1f1b", "zb-h1")
"""The schedules whose predicted order (solver against the classic ones) is checked."""
TIE = 0.01
"""Predicted makespans closer than this fraction are a tie: no order is predicted."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--pp", type=int, default=2, help="pipeline devices (processes)")
    add("-m", "--microbatches", type=int, default=8)
    add("--mbs", type=int, default=1, help="sequences per microbatch")
    add("--layers", type=int, default=4, help="decoder layers")
    add("--hidden", type=int, default=256)
    add("--heads", type=int, default=4)
    add("--vocab", type=int, default=2048)
    add("--seq", type=int, default=128)
    add("--hardware", default=None, help="hardware card (default: cpu, or by GPU name)")
    add("--schedules", default="cpsat,1f1b,zb-h1,cpsat-offload",
        help="comma-separated: cpsat, cpsat-fused, any baseline, <name>-offload")  # fmt: skip
    add("--time-limit", type=float, default=10.0, help="solver seconds per solve")
    add("--profile-repeats", type=int, default=20)
    add("--profile-warmup", type=int, default=3)
    add("--alone", action="store_true", help="profile one stage at a time, not all at once")
    add("--round-profile", type=int, default=10,
        help="repeats of a profile at the start of every round (0: none)")  # fmt: skip
    add("--rounds", type=int, default=6, help="interleaved rounds of timed steps")
    add("--steps", type=int, default=3, help="timed steps per schedule and round")
    add("--warmup-steps", type=int, default=2, help="steps per schedule before timing")
    add("--threads", type=int, default=None,
        help="torch threads per rank (default: CPU cores / pp on CPU)")  # fmt: skip
    add("--json", type=Path, default=None, help="write the results as JSON")
    return parser.parse_args()


def hardware_of(args: argparse.Namespace) -> str:
    if args.hardware:
        return str(args.hardware)
    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name().lower()
    return "h200" if "h200" in name else "h100-80gb" if "h100" in name else "a100-80gb"


def card_of(args: argparse.Namespace) -> Any:
    spec = dict(layers=args.layers, hidden=args.hidden, heads=args.heads, vocab=args.vocab,
                seq=args.seq, dtype="bf16" if torch.cuda.is_available() else "fp32")  # fmt: skip
    return model_card_from_dict(spec, f"decoder-{args.layers}x{args.hidden}")


def worker(rank: int, world: int, port: int, job: dict[str, Any], out: str) -> None:
    """One pipeline rank: run every schedule in interleaved rounds; rank 0 writes the times."""
    from pp_opt.profiler.torch.model import make_batch
    from pp_opt.runtime.timed_run import compare_schedules

    torch.set_num_threads(job["threads"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    try:
        card = job["card"]
        schedules = {name: loads_schedule(text) for name, text in job["schedules"].items()}
        rows = job["m"] * job["mbs"]
        batch = make_batch(card, rows=rows, seq=card.seq, device=device)
        dtype = card.dtype if cuda else "fp32"
        result, profiles = compare_schedules(
            schedules, card, batch, rank=rank, device=device, rounds=job["rounds"],
            steps=job["steps"], warmup=job["warmup"], dtype=dtype,
            profile_repeats=job["round_profile"],
        )  # fmt: skip
        if rank == 0:
            Path(out).write_text(json.dumps({"schedules": result, "profiles": profiles}))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_schedules(args: argparse.Namespace, card: Any, schedules: dict[str, Any], threads: int):
    job = {"card": card, "schedules": {n: dumps_schedule(s) for n, s in schedules.items()},
           "m": args.microbatches, "mbs": args.mbs, "rounds": args.rounds, "steps": args.steps,
           "warmup": args.warmup_steps, "threads": threads,
           "round_profile": args.round_profile}  # fmt: skip
    method = "spawn" if torch.cuda.is_available() else "fork"
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "times.json")
        mp.start_processes(worker, args=(args.pp, _free_port(), job, out), nprocs=args.pp,
                           start_method=method)  # fmt: skip
        return json.loads(Path(out).read_text())


def ranking(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """For each pair of ranked schedules: does the measured order follow the predicted one?

    Once with the profile taken before the runs (medians over all timed steps), and round by
    round with that round's own profile and measurements (where rounds were profiled).
    """
    out = []
    present = [n for n in RANKED if n in rows]
    for a, b in combinations(present, 2):
        ra, rb = rows[a], rows[b]
        pred = ra["predicted"] - rb["predicted"]
        meas = ra["median"] - rb["median"]
        tie = abs(pred) < TIE * min(ra["predicted"], rb["predicted"])
        pair = {"pair": [a, b], "predicted_diff": pred, "measured_diff": meas, "tie": tie,
                "holds": None if tie else (pred < 0) == (meas < 0)}  # fmt: skip
        verdicts = []
        predicted_rounds = zip(ra["round_predicted"], rb["round_predicted"], strict=True)
        for (pa, pb), ma, mb in zip(predicted_rounds, ra["per_round"], rb["per_round"]):  # noqa: B905
            if abs(pa - pb) >= TIE * min(pa, pb):
                verdicts.append((pa < pb) == (ma < mb))
        pair.update(rounds_checked=len(verdicts), rounds_holding=sum(verdicts))
        out.append(pair)
    return out


def make_schedules(problem: Any, names: list[str], time_limit: float) -> dict[str, Any]:
    """The schedules by name; an offload one that cannot be made here is skipped, with why."""
    plain = [n.removesuffix(OFFLOAD_SUFFIX) for n in names]
    built = plan_schedules(problem, list(dict.fromkeys(plain)), time_limit=time_limit, threads=1)
    out = {}
    for name, base in zip(names, plain, strict=True):
        try:
            out[name] = built[base] if name == base else with_offload(built[base])
        except ProblemError as err:
            print(f"{name}: skipped ({err})")
    return out


def made_by(schedule: Any) -> str:
    """Which solver or baseline made a schedule; for a solver, whether its warm start won."""
    info = schedule.solver
    if info is None:
        return "?"
    text = f"{info.name} ({info.status})"
    warm = info.extra.get("warm_start")
    if warm and info.extra.get("warm_start_objective") == info.objective:
        text += f", the warm start {warm!r} (nothing better found)"
    return text


def analyse(schedules: dict[str, Any], measured: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per schedule: predictions (profile before the runs, each round's profile, the runtime's
    own op times) against the measured iteration times."""
    rows: dict[str, dict[str, Any]] = {}
    profiles = measured["profiles"]
    for name, schedule in schedules.items():
        got = measured["schedules"][name]
        it = got["iteration"]
        predicted = schedule.metrics.makespan
        round_predicted = [
            with_measured_times(schedule, prof).metrics.makespan for prof in profiles
        ]
        round_ratios = [p / m for p, m in zip(round_predicted, got["per_round"], strict=False)]
        rows[name] = {
            "predicted": predicted, "median": it["median"], "iqr": it["iqr"],
            "ratio": predicted / it["median"],
            "round_predicted": round_predicted, "per_round": got["per_round"],
            "round_ratio": statistics.median(round_ratios) if round_ratios else None,
            "round_ratios": round_ratios,
            "retimed": with_measured_times(schedule, got["actions"]).metrics.makespan,
            "actions": got["actions"],
            "offloads": sum(1 for op in schedule.ops if op.kind == "OFFLOAD"),
            "made_by": made_by(schedule),
            "ranks": got["ranks"], "per_step": got["per_step"], "losses": got["losses"],
        }  # fmt: skip
    return rows


def main() -> None:
    args = parse_args()
    names = [n.strip() for n in args.schedules.split(",") if n.strip()]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if 0 < gpus < args.pp:
        raise SystemExit(f"--pp {args.pp} needs one GPU per rank (NCCL); {gpus} found: use "
                         f"--pp {gpus}, or the CPU (CUDA_VISIBLE_DEVICES='')")  # fmt: skip
    cores = os.cpu_count() or 1
    threads = args.threads or (1 if torch.cuda.is_available() else max(1, cores // args.pp))
    card = card_of(args)
    started = time.perf_counter()
    with LoadMonitor() as profile_load:
        costs = profile_costs(model=card, hardware=hardware_of(args), pp=args.pp,
                              microbatches=args.microbatches,
                              mbs=args.mbs, measure=True, repeats=args.profile_repeats,
                              warmup=args.profile_warmup, threads=threads,
                              concurrent=not args.alone)  # fmt: skip
    print(costs_table(costs))
    print(f"profile: {describe(profile_load.result)}\n")
    problem = problem_from_costs(costs)
    schedules = make_schedules(problem, names, args.time_limit)
    with LoadMonitor() as run_load:
        measured = run_schedules(args, card, schedules, threads)
    rows = analyse(schedules, measured)
    pairs = ranking(rows)
    print_table(args, rows, pairs, costs, run_load.result, threads)
    if args.json:
        data = {"format": "pp-opt.fidelity", "version": 1, "args": vars(args) | {"json": None},
                "threads": threads, "costs": costs, "rows": rows, "ranking": pairs,
                "round_profiles": measured["profiles"],
                "load": {"profile": profile_load.result, "run": run_load.result},
                "seconds": time.perf_counter() - started}  # fmt: skip
        args.json.write_text(json.dumps(data, indent=1, default=str) + "\n")
        print(f"wrote {args.json}")


def print_actions(rows: dict[str, dict[str, Any]], costs: dict[str, Any]) -> None:
    """Per op: the profiled median next to the median the runtime took in each schedule."""
    names = {"F": "t_f", "B": "t_b", "W": "t_w", "BW": "t_bw"}
    keys = sorted({k for r in rows.values() for k in r["actions"]}, key=lambda k: (k[-1], k))
    print("op durations (ms): profiled | as run in " + ", ".join(rows))
    for key in keys:
        kind, stage = key.rstrip("0123456789"), int(key.lstrip("BFW"))
        row = costs["stages"][stage]
        prof = row.get(names[kind], row["t_b"] + row["t_w"] if kind == "BW" else None)
        ran = " ".join(f"{r['actions'][key]:7.2f}" if key in r["actions"] else f"{'-':>7}"
                       for r in rows.values())  # fmt: skip
        print(f"  {key:<4} {prof:7.2f} | {ran}")


def print_table(args, rows, pairs, costs, load, threads) -> None:
    steps = args.rounds * args.steps
    print(f"p={args.pp} m={args.microbatches} decoder {args.layers}x{args.hidden} seq {args.seq}, "
          f"{threads} thread(s)/rank; {steps} timed steps per schedule in {args.rounds} "
          f"interleaved rounds after {args.warmup_steps} warm-up steps; ms")  # fmt: skip
    print(f"{'schedule':<16} {'predicted':>9} {'measured':>9} {'iqr':>7} {'pred/meas':>9} "
          f"{'per-round':>9} {'retimed':>8} {'offloads':>8}  per-rank medians")  # fmt: skip
    for name, r in rows.items():
        per_rank = " ".join(f"{x['pipeline']['median']:.1f}" for x in r["ranks"])
        per_round = f"{r['round_ratio']:9.3f}" if r["round_ratio"] is not None else f"{'-':>9}"
        print(f"{name:<16} {r['predicted']:9.2f} {r['median']:9.2f} {r['iqr']:7.2f} "
              f"{r['ratio']:9.3f} {per_round} {r['retimed'] / r['median']:8.3f} "
              f"{r['offloads']:8d}  {per_rank}")  # fmt: skip
    print("predicted: makespan on the profile taken before the runs; measured: median of the "
          "slowest rank's pipe.step, optimizer excluded;\nper-round: median over rounds of "
          "predicted/measured with each round's own profile; retimed: the schedule's order timed "
          "with the op durations the runtime took, over measured")  # fmt: skip
    for name, r in rows.items():
        print(f"  {name}: {r['made_by']}")
    print_actions(rows, costs)
    worst = max(abs(r["ratio"] - 1.0) for r in rows.values())
    print(f"largest |pred/meas - 1|: {worst:.1%} (target 10%)", end="")
    ratios = [r["round_ratio"] for r in rows.values() if r["round_ratio"] is not None]
    if ratios:
        print(f"; with each round's profile: {max(abs(x - 1.0) for x in ratios):.1%}", end="")
    print()
    for p in pairs:
        a, b = p["pair"]
        rounds = (f"; with each round's profile it holds in {p['rounds_holding']} of "
                  f"{p['rounds_checked']} rounds that predict an order"
                  if args.round_profile else "")  # fmt: skip
        if p["tie"]:
            print(f"ranking {a} = {b}: predicted within {TIE:.0%}, a tie (measured diff "
                  f"{p['measured_diff']:+.2f} ms){rounds}")  # fmt: skip
            continue
        want = f"{a} {'<' if p['predicted_diff'] < 0 else '>'} {b}"
        print(f"ranking {want} (predicted by {abs(p['predicted_diff']):.2f} ms): "
              f"{'holds' if p['holds'] else 'does NOT hold'} in the medians "
              f"(measured diff {p['measured_diff']:+.2f} ms){rounds}")  # fmt: skip
    print(f"run: {describe(load)}")


if __name__ == "__main__":
    sys.exit(main())
