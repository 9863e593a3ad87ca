"""Benchmark the solvers against the classic schedules (issue 3, Measure).

Parts (``--parts``, comma separated):

- ``configs``: the four Zero Bubble configurations of DESIGN.md §7 at caps
  ``p·M_B`` and ``2p·M_B``, objectives ``span`` and ``makespan``, placements
  ``loop`` (v = 1) and ``v``: every classic schedule and pp_opt.
- ``offload``: ``t_f = t_b = t_w = 1``, ``t_comm = 0.05``, ``p = 8``, ``m = 32``,
  full-activation copy time ``3k`` for ``k`` in {0.5, 1.0}, caps ``p·M_B/2`` and
  ``p·M_B/4``, against the best no-offload makespan at ``p·M_B``.
- ``scale``: solve time and gap for ``p`` in {4, 8, 16, 32, 64}, ``m = 4p``.

Prints a table and writes JSON (``--json``). Example::

    python scripts/bench_solvers.py --parts configs --time-limit 20 --json bench.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pp_opt.errors import InfeasibleError, PPOptError
from pp_opt.orders import baseline, baseline_names
from pp_opt.orders.common import same_placement
from pp_opt.problem import Device, Problem, Stage, uniform_problem
from pp_opt.problem_io import load_problem, resplit
from pp_opt.solvers import solve

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ("zb-1.5b", "zb-6.2b", "zb-14.6b", "zb-28.3b")
HEADER = ("instance", "schedule", "status", "makespan", "span", "bubble", "peak", "gap", "sec")


def with_cap(problem: Problem, cap: float) -> Problem:
    return problem.replace(devices=tuple(Device(cap=cap, static=d.static) for d in problem.devices))


def row_of(instance: str, name: str, schedule, seconds: float) -> dict:  # noqa: ANN001
    m, info = schedule.metrics, schedule.solver
    return {
        "instance": instance,
        "schedule": name,
        "status": info.status,
        "makespan": m.makespan,
        "span": max(m.span),
        "bubble_rate": m.bubble_rate,
        "peak_memory": max(m.peak_memory),
        "objective": info.objective,
        "lower_bound": info.lower_bound,
        "gap": info.gap,
        "seconds": seconds,
    }


def run_instance(instance: str, problem: Problem, args: argparse.Namespace) -> list[dict]:
    """Every classic schedule that fits (or why not), then pp_opt."""
    rows = []
    for name in baseline_names():
        t0 = time.perf_counter()
        try:
            schedule = baseline(name, problem)
        except InfeasibleError as err:
            rows.append({"instance": instance, "schedule": name, "status": "over cap",
                         "needs": err.min_cap})  # fmt: skip
            continue
        except PPOptError as err:
            rows.append({"instance": instance, "schedule": name, "status": f"n/a: {err}"})
            continue
        label = (
            name
            if same_placement(schedule.problem, problem)
            else f"{name} (v={schedule.problem.v}, {schedule.problem.placement})"
        )
        rows.append(row_of(instance, label, schedule, time.perf_counter() - t0))
    t0 = time.perf_counter()
    try:
        result = solve(
            problem, solver=args.solver, time_limit=args.time_limit, threads=args.threads,
            seed=args.seed, offload_fractions=args.fractions,
        )  # fmt: skip
        row = row_of(instance, f"pp_opt/{args.solver}", result.schedule, time.perf_counter() - t0)
        row["warm_start"] = result.warm_start.name if result.warm_start else None
        rows.append(row)
    except PPOptError as err:
        rows.append({"instance": instance, "schedule": "pp_opt", "status": f"error: {err}"})
    for row in rows:
        print_row(row)
    return rows


def print_row(row: dict) -> None:
    if "makespan" not in row:
        need = f" (needs {row['needs']:.4g})" if row.get("needs") is not None else ""
        print(f"{row['instance']:<34} {row['schedule']:<24} {row['status']}{need}", flush=True)
        return
    gap = "-" if row["gap"] is None else f"{row['gap']:.2%}"
    print(
        f"{row['instance']:<34} {row['schedule']:<24} {row['status']:<9} "
        f"{row['makespan']:>10.2f} {row['span']:>10.2f} {row['bubble_rate']:>7.4f} "
        f"{row['peak_memory']:>6.3g} {gap:>7} {row['seconds']:>6.1f}",
        flush=True,
    )


def part_configs(args: argparse.Namespace) -> list[dict]:
    rows = []
    for config in args.configs:
        base = load_problem(ROOT / "examples" / f"{config}.toml")
        for placement in ("loop", "v"):
            shaped = base if placement == "loop" else resplit(base, "v", 2)
            for factor in (1, 2):
                cap = factor * base.p * base.stages[0].m_b
                for objective in ("span", "makespan"):
                    problem = with_cap(shaped, cap).replace(objective=objective)
                    name = f"{config} {placement} cap={factor}p {objective}"
                    rows += run_instance(name, problem, args)
    return rows


def offload_problem(k: float, cap: float, offload: bool) -> Problem:
    p, m = 8, 32
    stage = dict(t_f=1.0, t_b=1.0, t_w=1.0, m_b=1.0, m_w=0.0, t_offload=3 * k, t_reload=3 * k)
    stages = tuple(Stage(device=d, **stage) for d in range(p))
    return Problem(p=p, m=m, stages=stages, devices=tuple(Device(cap=cap) for _ in range(p)),
                   t_comm=0.05, offload=offload, name=f"offload k={k}")  # fmt: skip


def part_offload(args: argparse.Namespace) -> list[dict]:
    rows = run_instance("offload ref cap=p no-offload", offload_problem(0.5, 8.0, False), args)
    for k in (0.5, 1.0):
        for divisor in (2, 4):
            problem = offload_problem(k, 8.0 / divisor, True)
            rows += run_instance(f"offload k={k} cap=p/{divisor}", problem, args)
    return rows


def part_scale(args: argparse.Namespace) -> list[dict]:
    rows = []
    for p in args.scale_p:
        problem = uniform_problem(p=p, m=4 * p, t_f=1.0, t_b=1.0, t_w=1.0, m_w=0.3, t_comm=0.05,
                                  cap=float(p))  # fmt: skip
        t0 = time.perf_counter()
        try:
            result = solve(
                problem, solver=args.solver, time_limit=args.time_limit,
                threads=args.threads, seed=args.seed,
            )  # fmt: skip
            row = row_of(f"scale p={p} m={4 * p} cap=p", "pp_opt", result.schedule,
                         time.perf_counter() - t0)  # fmt: skip
            row["warm_start"] = result.warm_start.name if result.warm_start else None
        except PPOptError as err:
            row = {"instance": f"scale p={p}", "schedule": "pp_opt", "status": f"error: {err}"}
        print_row(row)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="configs,offload,scale")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--scale-p", default="4,8,16,32,64")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--solver", default="cpsat")
    parser.add_argument("--fractions", default="1.0", help="Offload fractions, e.g. 0.5,1.0.")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    args.configs = [c for c in args.configs.split(",") if c]
    args.scale_p = [int(x) for x in args.scale_p.split(",") if x]
    args.fractions = tuple(float(x) for x in args.fractions.split(","))
    print(" ".join(f"{h:<10}" for h in HEADER))
    rows: list[dict] = []
    parts = {"configs": part_configs, "offload": part_offload, "scale": part_scale}
    for part in args.parts.split(","):
        if part not in parts:
            print(f"unknown part {part!r}; use {', '.join(parts)}", file=sys.stderr)
            return 2
        rows += parts[part](args)
    if args.json is not None:
        args.json.write_text(json.dumps({"time_limit": args.time_limit, "threads": args.threads,
                                         "rows": rows}, indent=1))  # fmt: skip
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
