"""Our rule generators against the Zero Bubble anchors of issue 10, one row per instance.

For each row of ``scripts/anchors.json`` it builds the instance
(``scripts/tight_instances.py``), runs our generator for it (``v-half``, ``v-min``
or ``pipeoffload`` from ``pp_opt.orders``), times the order with the simulator,
validates it at the cap and prints: anchor makespan and offloads, ours, peak, wall
seconds. Example::

    python scripts/check_rules.py --rows 1.5b-v-half,pipeoffload-k0.5-cap2 --time-limit 10
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tight_instances import INSTANCES

from pp_opt.ops import OpKind
from pp_opt.orders.memory.controllable_memory import v_half, v_min
from pp_opt.orders.memory.pipeoffload import pipeoffload
from pp_opt.simulator import simulate
from pp_opt.validator import validate

ROOT = Path(__file__).resolve().parent.parent


def generator_of(name: str):  # noqa: ANN201
    if name.endswith("v-half"):
        return v_half
    if name.endswith("v-min"):
        return v_min
    return pipeoffload


def run_row(row: dict, time_limit: float) -> dict:
    problem = INSTANCES[row["name"]]()
    started = time.perf_counter()
    pieces = generator_of(row["name"])(problem, time_limit=time_limit)
    schedule = simulate(pieces)
    seconds = time.perf_counter() - started
    violations = validate(schedule)
    return {
        "name": row["name"],
        "cap": row["cap"],
        "anchor": row["anchor_makespan"],
        "anchor_replay": row["replay_makespan"],
        "anchor_offloads": row["offloads"],
        "makespan": schedule.metrics.makespan,
        "offloads": sum(1 for op in schedule.ops if op.kind is OpKind.OFFLOAD),
        "peak": max(schedule.metrics.peak_memory),
        "valid": not violations,
        "seconds": seconds,
        "settings": dict(pieces.settings),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="", help="Comma-separated row names; all by default.")
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = json.loads((ROOT / "scripts" / "anchors.json").read_text())["rows"]
    wanted = [r for r in args.rows.split(",") if r]
    out = []
    print(f"{'instance':<26} {'cap':>5} {'anchor':>9} {'(offl)':>7} {'ours':>9} {'(offl)':>7} "
          f"{'peak':>6} {'valid':>5} {'sec':>6}")  # fmt: skip
    for row in rows:
        if wanted and row["name"] not in wanted:
            continue
        result = run_row(row, args.time_limit)
        out.append(result)
        print(f"{result['name']:<26} {result['cap']:>5g} {result['anchor']:>9.2f} "
              f"{result['anchor_offloads']:>7} {result['makespan']:>9.2f} {result['offloads']:>7} "
              f"{result['peak']:>6.3g} {str(result['valid']):>5} {result['seconds']:>6.1f}",
              flush=True)  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps({"time_limit": args.time_limit, "rows": out}, indent=1))
    return 0 if all(r["valid"] and r["makespan"] <= r["anchor"] + 1e-6 for r in out) else 1


if __name__ == "__main__":
    sys.exit(main())
