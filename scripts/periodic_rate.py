"""How fast a pipeline can run forever under its caps: periodic schedules of k microbatches.

Issue 28's ``v`` family at p 4, cap 2.5 gains about 2.8 of makespan per added microbatch
(27.10 at m 8, 38.30 at m 12) though each device works 2.6 per microbatch: the memory
caps slow the steady state. This asks CP-SAT whether a schedule that repeats every
``k * rate`` with ``k`` microbatches per period exists (each op at one start per
microbatch, every copy shifted by whole periods; each stage's ops of one kind in
microbatch order; one op at a time per busy device; memory held from a forward's start to
its backward's and W's end, under each device's cap). It is an analysis tool, not part of
the solver: a finite schedule need not be periodic, so no bound of pp_opt comes from it.

    python scripts/periodic_rate.py --m 12 --cap 2.5 --k 2 --rates 2.6,2.75,2.85
    python scripts/periodic_rate.py --cap 2.5 --caps-only 2 --busy 2,3 --rates 2.6
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from ortools.sat.python import cp_model

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tight_instances  # noqa: E402

from pp_opt.dag import stage_latency  # noqa: E402
from pp_opt.problem import Problem  # noqa: E402


def _units(values: list[float]) -> float:
    """Integer units per problem unit: hundredths, divided by their greatest common divisor
    (CP-SAT answers these questions faster on small numbers)."""
    return 100 / math.gcd(*(round(v * 100) for v in values if v > 0))


def periodic_feasible(
    problem: Problem, *, k: int, period: float, caps: dict[int, float], busy: set[int],
    time_limit: float,
) -> str:  # fmt: skip
    """CP-SAT's answer (``OPTIMAL`` = such a schedule exists, ``INFEASIBLE``, ``UNKNOWN``)."""
    stages = range(problem.num_stages)
    st = problem.stages
    unit = _units([problem.t_comm, period] + [getattr(x, f"t_{o}") for x in st for o in "fbw"])
    mem = _units([x.m_b - x.m_w for x in st] + [x.m_w for x in st] + list(caps.values()))
    h = round(period * unit)
    dev = [problem.device_of(s) for s in stages]
    lag = stage_latency(problem)
    dur = {(s, o): round(getattr(st[s], f"t_{o.lower()}") * unit)
           for s in stages for o in "FBW"}  # fmt: skip
    span = 4 * h  # an op starts within four periods of its microbatch's first forward
    model = cp_model.CpModel()
    x = {(s, j, o): model.new_int_var(0, span, f"{o}{s}_{j}")
         for s in stages for j in range(k) for o in "FBW"}  # fmt: skip
    model.add(x[(0, 0, "F")] == 0)
    last = problem.num_stages - 1
    for j in range(k):
        for s in stages:
            if s < last:
                gap = round(lag(s, s + 1) * unit)
                model.add(x[(s + 1, j, "F")] >= x[(s, j, "F")] + dur[(s, "F")] + gap)
                model.add(x[(s, j, "B")] >= x[(s + 1, j, "B")] + dur[(s + 1, "B")] + gap)
            model.add(x[(s, j, "W")] >= x[(s, j, "B")] + dur[(s, "B")])
        model.add(x[(last, j, "B")] >= x[(last, j, "F")] + dur[(last, "F")])
    for s in stages:
        for o in "FBW":
            for j in range(k - 1):
                model.add(x[(s, j + 1, o)] >= x[(s, j, o)] + dur[(s, o)])
            model.add(x[(s, 0, o)] + h >= x[(s, k - 1, o)] + dur[(s, o)])
    copies = range(10)  # enough shifted copies to cover every moment of a middle period
    for d in range(problem.p):
        ops, held, demand = [], [], []
        for s in (s for s in stages if dev[s] == d):
            for j in range(k):
                for n in copies:
                    for o in "FBW":
                        ops.append(model.new_fixed_size_interval_var(
                            x[(s, j, o)] + n * h, dur[(s, o)], ""))  # fmt: skip
                    f = x[(s, j, "F")] + n * h
                    for o, amount in (("B", st[s].m_b - st[s].m_w), ("W", st[s].m_w)):
                        end = x[(s, j, o)] + dur[(s, o)] + n * h
                        size = model.new_int_var(0, 10 * span, "")
                        model.add(size == end - f)
                        held.append(model.new_interval_var(f, size, end, ""))
                        demand.append(round(amount * mem))
        if d in busy:
            model.add_no_overlap(ops)
        if d in caps:
            model.add_cumulative(held, demand, round(caps[d] * mem))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit
    solver.parameters.num_workers = 2
    return solver.status_name(solver.solve(model))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--p", type=int, default=4)
    ap.add_argument("--m", type=int, default=12, help="only names the family's instance")
    ap.add_argument("--cap", type=float, default=2.5)
    ap.add_argument("--k", type=int, default=2, help="microbatches per period")
    ap.add_argument("--rates", default="2.6,2.75,2.85", help="time per microbatch, comma list")
    ap.add_argument("--caps-only", default="", help="devices whose cap applies (default all)")
    ap.add_argument("--busy", default="", help="devices that run one op at a time (default all)")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    problem = tight_instances.exact_instance(args.p, args.m, args.cap)
    every = range(problem.p)
    capped = [int(d) for d in args.caps_only.split(",") if d] or list(every)
    busy = {int(d) for d in args.busy.split(",") if d} or set(every)
    caps = {d: problem.activation_room(d) for d in capped}
    rows = []
    print(f"caps on devices {capped}, one op at a time on {sorted(busy)}")
    print(f"{'k':>2} {'per microbatch':>14} {'period':>7}  answer")
    for rate in (float(r) for r in args.rates.split(",")):
        answer = periodic_feasible(problem, k=args.k, period=args.k * rate, caps=caps,
                                   busy=busy, time_limit=args.time_limit)  # fmt: skip
        print(f"{args.k:>2} {rate:>14.3f} {args.k * rate:>7.2f}  {answer}", flush=True)
        rows.append({"k": args.k, "rate": rate, "answer": answer, "caps_on": capped,
                     "busy": sorted(busy), "cap": args.cap})  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
