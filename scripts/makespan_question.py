"""Is there a schedule of makespan <= X? CP-SAT's portfolio on the full model, no hint.

The proofs of the exact instances (``bench_solvers.py --parts exact``) end with such a
question ("anything better than the incumbent?"). Asking it alone measures how hard a
proof at a given makespan is, and pins an optimum between a schedule found and a
makespan proved impossible (issue 28: p 4, m 12, cap 2.5 has none of 38.25 or less).

    python scripts/makespan_question.py --p 4 --m 12 --cap 2.5 --at-most 38.25 --time-limit 400
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ortools.sat.python import cp_model

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tight_instances  # noqa: E402

from pp_opt.dag import dag_for  # noqa: E402
from pp_opt.solvers.base import SolveOptions  # noqa: E402
from pp_opt.solvers.cpsat.model import build_model  # noqa: E402

ANSWERS = {"OPTIMAL": "yes", "FEASIBLE": "yes", "INFEASIBLE": "no", "UNKNOWN": "no answer"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--p", type=int, default=4)
    ap.add_argument("--m", type=int, default=12)
    ap.add_argument("--cap", type=float, default=2.5)
    ap.add_argument("--at-most", type=float, required=True, help="the makespan asked for")
    ap.add_argument("--time-limit", type=float, default=300.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    problem = tight_instances.exact_instance(args.p, args.m, args.cap)
    built = build_model(problem, dag_for(problem), SolveOptions(threads=args.workers))
    built.model.add(built.objective <= round(args.at_most * built.scaling.time))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = args.time_limit
    solver.parameters.num_workers = args.workers
    solver.parameters.random_seed = args.seed
    solver.parameters.linearization_level = 2  # as the solve's proof phase
    started = time.perf_counter()
    status = solver.status_name(solver.solve(built.model))
    seconds = time.perf_counter() - started
    answer = ANSWERS.get(status, status)
    found = solver.objective_value / built.scaling.time if answer == "yes" else None
    print(f"{problem.name}: makespan <= {args.at_most:g}? {answer} ({status}) in {seconds:.1f} s"
          + (f", found {found:.2f}" if found is not None else ""))  # fmt: skip
    if args.json:
        row = {"instance": problem.name, "at_most": args.at_most, "answer": answer,
               "status": status, "seconds": seconds, "found": found, "seed": args.seed,
               "workers": args.workers}  # fmt: skip
        args.json.write_text(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
