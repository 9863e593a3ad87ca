"""Benchmark the planner (issue 17, "done when").

Parts (``--parts``, comma separated; each runs ``pp-opt plan`` as a user would):

- ``pinned``: llama3-8b on 4 H100s, global batch 16, seq 8192, ``--tp 1 --pp 4 --mbs 1
  --time-limit 300``: the plan ends within its limit, ``best.json`` passes ``pp-opt
  validate``, and its ``iteration_makespan`` is at most 0.93 x 5214.2 ms (the even split
  8,8,8,8 solved alone by ``pp-opt solve --time-limit 10``) and below every default in the
  plan.
- ``resolve``: the pinned plan's top candidate re-solved alone for 60 s (its problem as the
  plan builds it, through ``pp_opt.solve``): within 1% of the plan's figure.
- ``ray``: the pinned plan again with ``--ray local`` (a local Ray runtime): its top 5
  against the process pool's.
- ``unpinned``: ``--gpus 8 --global-batch 64 --seq 8192 --time-limit 600``: every legal
  configuration evaluated or pruned within the limit; the counts.

Prints a table and writes JSON (``--json``), and Markdown for the docs (``--markdown``: the
checks and each plan's top 5, under the command, commit, date and machine). The machine
should be quiet: the plans solve in parallel (``--workers``, default 2). Example::

    python scripts/bench_plan.py --parts pinned,resolve --out bench-plan --json bench-plan.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

EVEN_SPLIT_MS = 5214.2
"""``pp-opt solve --model llama3-8b --hardware h100-80gb --pp 4 --microbatches 16 --mbs 1
--seq 8192 --time-limit 10`` (issue 17)."""
TARGET = 0.93
PINNED = [
    "--model",
    "llama3-8b",
    "--hardware",
    "h100-80gb",
    "--gpus",
    "4",
    "--global-batch",
    "16",
    "--seq",
    "8192",
    "--tp",
    "1",
    "--pp",
    "4",
    "--mbs",
    "1",
    "--time-limit",
    "300",
]
UNPINNED = [
    "--model",
    "llama3-8b",
    "--hardware",
    "h100-80gb",
    "--gpus",
    "8",
    "--global-batch",
    "64",
    "--seq",
    "8192",
    "--time-limit",
    "600",
]
PP_OPT = [sys.executable, "-m", "pp_opt"]


def run_plan(
    args: list[str], out: Path, name: str, workers: int, extra: list[str]
) -> dict[str, Any]:
    """Run ``pp-opt plan``; its wall time, exit code and plan JSON."""
    plan, best = out / f"{name}.json", out / f"{name}.best.json"
    cmd = [
        *PP_OPT,
        "plan",
        *args,
        "--workers",
        str(workers),
        "-o",
        str(plan),
        "--schedule",
        str(best),
        "--plot",
        str(out / f"{name}.png"),
        "--quiet",
        *extra,
    ]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    print(done.stdout)
    if done.returncode:
        print(done.stderr, file=sys.stderr)
    data = json.loads(plan.read_text()) if plan.exists() else {}
    return {
        "command": " ".join(["pp-opt", *cmd[3:]]),
        "wall_s": wall,
        "rc": done.returncode,
        "plan": data,
        "best": str(best),
    }


def _top(data: dict[str, Any], count: int = 5) -> list[dict[str, Any]]:
    return [
        {"config": c["config"], "step_time": c["step_time"]}
        for c in data.get("candidates", [])[:count]
    ]


def pinned(out: Path, workers: int) -> dict[str, Any]:
    result = run_plan(PINNED, out, "pinned", workers, [])
    data = result.pop("plan")
    best = data["candidates"][0]
    valid = subprocess.run(
        [*PP_OPT, "validate", result["best"]], capture_output=True, text=True, check=False
    )
    defaults = [b for b in data["baselines"] if b["iteration_makespan"] is not None]
    lowest = min(b["iteration_makespan"] for b in defaults)
    makespan = best["iteration_makespan"]
    return {
        **result,
        "best": best["config"],
        "iteration_makespan": makespan,
        "ratio_to_even_split": makespan / EVEN_SPLIT_MS,
        "best_default": lowest,
        "validate": valid.stdout.strip(),
        "top5": _top(data),
        "checks": {
            "within_limit": result["wall_s"] <= 300.0,
            "valid": valid.returncode == 0,
            "target_0.93": makespan <= TARGET * EVEN_SPLIT_MS,
            "below_every_default": makespan < lowest,
        },
    }


def resolve(out: Path) -> dict[str, Any]:
    from pp_opt import solve
    from pp_opt.planner.config import Candidate, PlanInputs
    from pp_opt.planner.problems import build_problem
    from pp_opt.profiler import load_hardware_card, load_model_card

    data = json.loads((out / "pinned.json").read_text())
    top = data["candidates"][0]
    candidate = Candidate.from_dict(top["config"], seq=8192)
    inputs = PlanInputs(
        model=load_model_card("llama3-8b"),
        hardware=load_hardware_card("h100-80gb"),
        gpus=4,
        global_batch=16,
        seq=8192,
    )
    started = time.perf_counter()
    result = solve(build_problem(inputs, candidate), time_limit=60.0)
    alone = result.schedule.metrics.makespan
    return {
        "candidate": top["config"],
        "plan": top["iteration_makespan"],
        "alone_60s": alone,
        "difference": (top["iteration_makespan"] - alone) / alone,
        "seconds": time.perf_counter() - started,
        "checks": {"within_1%": abs(top["iteration_makespan"] - alone) <= 0.01 * alone},
    }


def on_ray(out: Path, workers: int) -> dict[str, Any]:
    result = run_plan(PINNED, out, "pinned-ray", workers, ["--ray", "local"])
    data = result.pop("plan")
    pool = json.loads((out / "pinned.json").read_text())
    mine, theirs = _top(data), _top(pool)
    same = [c["config"] for c in mine] == [c["config"] for c in theirs]
    as_set = sorted(map(json.dumps, (c["config"] for c in mine))) == sorted(
        map(json.dumps, (c["config"] for c in theirs))
    )
    spread = max(
        abs(a["step_time"] - b["step_time"]) / b["step_time"]
        for a, b in zip(mine, theirs, strict=True)
    )
    return {
        **result,
        "top5_ray": mine,
        "top5_pool": theirs,
        "largest_step_time_difference": spread,
        "checks": {"same_top5_in_order": same, "same_top5_candidates": as_set},
    }


def unpinned(out: Path, workers: int) -> dict[str, Any]:
    result = run_plan(UNPINNED, out, "unpinned", workers, [])
    data = result.pop("plan")
    return {
        **result,
        "counts": data["counts"],
        "pruned": data["pruned"],
        "skipped": data["skipped"],
        "top5": _top(data),
        "checks": {"within_limit": result["wall_s"] <= 600.0},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="pinned,resolve,ray,unpinned")
    parser.add_argument("--out", type=Path, default=Path("bench-plan"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path, help="Write the checks and top 5s as Markdown.")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    parts = {
        "pinned": lambda: pinned(args.out, args.workers),
        "resolve": lambda: resolve(args.out),
        "ray": lambda: on_ray(args.out, args.workers),
        "unpinned": lambda: unpinned(args.out, args.workers),
    }
    report: dict[str, Any] = {}
    for name in args.parts.split(","):
        report[name] = parts[name]()
    print(f"{'part':<10} {'check':<22} result")
    for name, part in report.items():
        for check, ok in part["checks"].items():
            print(f"{name:<10} {check:<22} {'ok' if ok else 'FAILED'}")
    if "pinned" in report:
        p = report["pinned"]
        print(
            f"pinned: {p['wall_s']:.1f} s, iteration_makespan {p['iteration_makespan']:.1f} ms "
            f"({p['ratio_to_even_split']:.3f} x {EVEN_SPLIT_MS}), best default "
            f"{p['best_default']:.1f} ms"
        )
    if "resolve" in report:
        r = report["resolve"]
        print(
            f"resolve: plan {r['plan']:.1f} ms, alone 60 s {r['alone_60s']:.1f} ms "
            f"({r['difference']:+.2%})"
        )
    if "unpinned" in report:
        u = report["unpinned"]
        print(f"unpinned: {u['wall_s']:.1f} s, counts {u['counts']}, pruned {u['pruned']}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.markdown is not None:
        write_markdown(args.markdown, report)


def write_markdown(path: Path, report: dict[str, Any]) -> None:
    """The checks of every part, then each plan's command, wall time and top 5."""
    from bench_markdown import fixed, table, text, write

    checks = [{"part": name, "check": check, "result": "ok" if ok else "FAILED"}
              for name, part in report.items() for check, ok in part["checks"].items()]  # fmt: skip
    sections = [("Checks", table(checks, [("part", "part", text), ("check", "check", text),
                                          ("result", "result", text)]))]  # fmt: skip
    for name, part in report.items():
        top = part.get("top5") or part.get("top5_ray")
        if not top:
            continue
        rows = [{"rank": i, "config": " ".join(f"{k}={v}" for k, v in c["config"].items()),
                 "step_time": c["step_time"]} for i, c in enumerate(top, 1)]  # fmt: skip
        body = (f"`{part['command']}`: {part['wall_s']:.1f} s.\n\n"
                + table(rows, [("rank", "#", text), ("config", "configuration", text),
                               ("step_time", "step time ms", fixed(1))]))  # fmt: skip
        sections.append((f"{name}: top 5", body))
    write(path, sections)


if __name__ == "__main__":
    main()
