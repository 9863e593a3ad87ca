"""The solver against the named overlapped-pair schedules on MoE jobs (issue 39, Done when).

For each job (DeepSeek-V3 and Qwen3-235B-A22B on H100 80GB, Megatron-Core with
``--overlap-moe-expert-parallel-comm``: ``Job(overlap=True)``), the cost model's problem
with F&B pairs on two placements of the same layer split: ``v`` (DualPipeV's) and ``loop``
with two chunks per rank (Megatron-Core's interleaved 1F1B). At each memory cap of a sweep
(every device's cap replaced; static memory kept), every named overlapped baseline that the
placement allows runs, and so does the solver (warm-started, as by default):

- ``v``: ``dualpipev-overlap`` (PyTorch's DualPipeV with its ``OVERLAP_F_B`` pairs) and
  ``dualpipe`` (DeepSeek's DualPipe; it runs on the ``dual`` placement made from this one,
  two copies of the parameters, which the solver does not take: its row is compared with
  the solver on ``v``);
- ``loop``: ``interleaved-1f1b-a2a`` (Megatron-Core's interleaved 1F1B with A2A overlap).

The caps: the hardware card's (the profile's natural cap), each baseline's own peak memory
where that is below it (the tightest cap it fits), and one halfway between the smallest
cap any schedule fits and the smallest of those (where no baseline fits). Each row gives
the baselines' makespans (or the cap each needs), the solver's makespan, status, bound and
gap, its pairs, and its makespan against the best baseline that fits. Every schedule goes
through :func:`pp_opt.validate`.

Prints a table; ``--json PATH`` writes the rows, ``--markdown PATH`` the table under its
provenance line (scripts/bench_markdown.py). Example::

    python scripts/bench_overlap.py --time-limit 20 --markdown overlap.md
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pp_opt
from pp_opt.errors import InfeasibleError, PPOptError
from pp_opt.job import Job
from pp_opt.ops import OpKind
from pp_opt.problem import Device, Problem

GIB = 2**30
HARDWARE = "h100-80gb"
STACK = "megatron-core"
BASELINES = {"v": ("dualpipev-overlap", "dualpipe"), "loop": ("interleaved-1f1b-a2a",)}
"""The named overlapped baselines each placement allows (pp_opt/orders/registry.py)."""
ALL_BASELINES = tuple(name for names in BASELINES.values() for name in names)

JOBS: dict[str, tuple[str, dict[str, Any]]] = {
    # 512 GPUs (pp 8 x dp 64), experts over the 64 GPUs of a stage, every layer recomputed
    "deepseek-v3": ("deepseek-v3", dict(
        pp=8, v=2, microbatches=16, seq=4096, mbs=1, tp=1, dp=64, ep=64, ac="full",
        layers=(3,) + (4,) * 14 + (2,),
    )),
    # 256 GPUs: Megatron-MoE-ModelZoo's layout (tp 2, ep 32, dp 16, its recomputed modules)
    "qwen3-235b-a22b": ("qwen3-235b-a22b", dict(
        pp=8, v=2, microbatches=16, seq=4096, mbs=1, tp=2, dp=16, ep=32,
        ac="modules:layernorm,moe_act", layers=(5,) + (6,) * 14 + (5,),
    )),
}  # fmt: skip
"""Job name -> (model card, :class:`~pp_opt.job.Job` fields but placement)."""


def job_problem(model: str, fields: dict[str, Any], placement: str) -> Problem:
    """The cost model's problem of the job with overlapped pairs on ``placement``."""
    job = Job(placement=placement, overlap=True, stack=STACK, **fields)
    return pp_opt.problem_from_profile(pp_opt.profile_job(job, model=model, hardware=HARDWARE))


def with_cap(problem: Problem, cap: float) -> Problem:
    """Every device's cap replaced by ``cap`` (its static memory kept)."""
    return problem.replace(devices=tuple(Device(cap=cap, static=d.static) for d in problem.devices))


def checked(schedule: pp_opt.Schedule, what: str) -> pp_opt.Schedule:
    """``schedule`` once :func:`pp_opt.validate` finds nothing wrong with it."""
    violations = pp_opt.validate(schedule)
    if violations:
        raise AssertionError(f"{what}: {len(violations)} violations, first {violations[0]}")
    return schedule


def run_baseline(name: str, problem: Problem) -> dict[str, Any]:
    """``name``'s makespan and peak at ``problem``'s caps, or the cap it needs."""
    try:
        schedule = checked(pp_opt.baseline(name, problem), name)
    except InfeasibleError as err:
        return {"fits": False, "needs": err.min_cap}
    except PPOptError as err:  # e.g. DualPipe's two copies of the parameters over the cap
        try:
            unbounded = pp_opt.baseline(name, with_cap(problem, 1e30))
        except PPOptError:
            return {"fits": False, "error": str(err)}
        return {"fits": False, "needs": max(unbounded.metrics.peak_memory), "error": str(err)}
    m = schedule.metrics
    return {"fits": True, "makespan": m.makespan, "peak": max(m.peak_memory)}


def cap_sweep(problem: Problem, names: Sequence[str]) -> list[float]:
    """The natural cap, each baseline's peak below it, and one cap halfway between the
    smallest feasible cap and the smallest of those (descending)."""
    natural = min(d.cap for d in problem.devices)
    caps = {natural}
    for name in names:
        result = run_baseline(name, problem)
        if result["fits"] and result["peak"] < natural * (1 - 1e-6):
            caps.add(result["peak"] * (1 + 1e-9))
    floor = pp_opt.min_feasible_cap(problem)
    if floor < min(caps):
        caps.add((floor + min(caps)) / 2)
    return sorted(caps, reverse=True)


def compare(
    problem: Problem,
    caps: Sequence[float],
    names: Sequence[str],
    *,
    time_limit: float,
    threads: int = 2,
    seed: int = 0,
    label: str = "",
) -> list[dict[str, Any]]:
    """One row per cap: each baseline of ``names``, the solver, and the solver against the
    best baseline that fits (``vs_best`` = solver / best - 1; None where none fits)."""
    rows = []
    for cap in caps:
        capped = with_cap(problem, cap)
        row: dict[str, Any] = {"instance": label or problem.name, "placement": problem.placement,
                               "cap": cap, "unit": problem.unit}  # fmt: skip
        fitting = {}
        for name in names:
            result = run_baseline(name, capped)
            row[name] = result
            if result["fits"]:
                fitting[name] = result["makespan"]
        t0 = time.perf_counter()
        try:
            solved = pp_opt.solve(capped, time_limit=time_limit, threads=threads, seed=seed)
        except InfeasibleError as err:
            row.update(status="infeasible", needs=err.min_cap, wall=time.perf_counter() - t0)
            rows.append(row)
            continue
        schedule = checked(solved.schedule, "solver")
        row.update(
            status=str(solved.status), makespan=schedule.metrics.makespan,
            lower_bound=solved.lower_bound, gap=solved.gap,
            pairs=sum(1 for op in schedule.ops if op.kind is OpKind.FB),
            peak=max(schedule.metrics.peak_memory),
            warm_start=solved.warm_start.name if solved.warm_start else None,
            wall=time.perf_counter() - t0,
        )  # fmt: skip
        if fitting:
            best = min(fitting, key=fitting.__getitem__)
            row.update(best=best, best_makespan=fitting[best],
                       vs_best=schedule.metrics.makespan / fitting[best] - 1)  # fmt: skip
        rows.append(row)
    return rows


def _baseline_cell(result: dict[str, Any] | None, scale: float) -> str | None:
    if result is None:
        return None
    if result["fits"]:
        return f"{result['makespan']:.1f}"
    if result.get("needs") is not None:
        return f"does not fit (needs {result['needs'] / scale:.1f})"
    return "n/a"


def display(row: dict[str, Any]) -> dict[str, Any]:
    """The row as the table shows it (caps and peaks in GiB when the problem is in bytes)."""
    scale = GIB if row["unit"] == "bytes" else 1.0
    keys = ("instance", "placement", "status", "makespan", "lower_bound", "gap", "pairs", "wall")
    shown = {key: row.get(key) for key in keys}
    shown["cap"] = row["cap"] / scale
    shown["peak"] = None if row.get("peak") is None else row["peak"] / scale
    for name in ALL_BASELINES:
        shown[name] = _baseline_cell(row.get(name), scale)
    if row.get("best") is not None:
        shown["vs_best"] = f"{row['vs_best']:+.2%} vs {row['best']}"
    if row.get("status") == "infeasible":
        shown["makespan"] = None
    return shown


COLUMNS_SPEC = [
    ("instance", "job"), ("placement", "placement"), ("cap", "cap GiB"),
    ("dualpipev-overlap", "dualpipev-overlap ms"), ("dualpipe", "dualpipe ms"),
    ("interleaved-1f1b-a2a", "interleaved-1f1b-a2a ms"), ("makespan", "solver ms"),
    ("status", "status"), ("lower_bound", "bound ms"), ("gap", "gap"), ("pairs", "pairs"),
    ("peak", "solver peak GiB"), ("vs_best", "solver vs best baseline"), ("wall", "wall s"),
]  # fmt: skip


def print_row(shown: dict[str, Any]) -> None:
    cells = []
    for key, header in COLUMNS_SPEC:
        value = shown.get(key)
        if value is None:
            text = "-"
        elif key == "gap":
            text = f"{value:.2%}"
        elif isinstance(value, float):
            text = f"{value:.1f}"
        else:
            text = str(value)
        cells.append(f"{header}={text}")
    print("  ".join(cells), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default=",".join(JOBS), help="Comma-separated job names.")
    parser.add_argument("--placements", default="v,loop")
    parser.add_argument("--time-limit", type=float, default=20.0, help="Seconds per solve.")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None, help="Write the table as Markdown.")
    args = parser.parse_args(argv)
    rows = []
    for job in args.jobs.split(","):
        model, fields = JOBS[job]
        for placement in args.placements.split(","):
            problem = job_problem(model, fields, placement)
            names = BASELINES[placement]
            caps = cap_sweep(problem, names)
            for row in compare(problem, caps, names, time_limit=args.time_limit,
                               threads=args.threads, seed=args.seed, label=job):  # fmt: skip
                print_row(display(row))
                rows.append(row)
    compared = [row for row in rows if row.get("vs_best") is not None]
    worst = max((row["vs_best"] for row in compared), default=None)
    print(f"{len(compared)} caps with a fitting baseline; solver at most the best at each: "
          f"{all(row['vs_best'] <= 1e-9 for row in compared)} (worst {worst})")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps({"time_limit": args.time_limit, "threads": args.threads,
                                         "hardware": HARDWARE, "stack": STACK,
                                         "jobs": {k: [m, {f: list(v) if isinstance(v, tuple)
                                                          else v for f, v in fs.items()}]
                                                  for k, (m, fs) in JOBS.items()},
                                         "rows": rows}, indent=1))  # fmt: skip
        print(f"wrote {args.json}")
    if args.markdown is not None:
        write_markdown(args.markdown, rows, argv)
    return 0


def job_lines() -> str:
    """One line per job: its model and layout."""
    lines = []
    for name, (model, fields) in JOBS.items():
        layout = ", ".join(f"{k} {list(v) if isinstance(v, tuple) else v}"
                           for k, v in fields.items())  # fmt: skip
        lines.append(f"- `{name}`: model card `{model}`, {HARDWARE}, stack {STACK}, "
                     f"overlap; {layout}.")  # fmt: skip
    return "\n".join(lines)


def write_markdown(path: Path, rows: list[dict[str, Any]], argv: list[str] | None) -> None:
    """The rows as the docs show them, under the line that says how they were made."""
    from bench_markdown import fixed, percent, table, text, write

    formats = {"cap": fixed(1), "makespan": fixed(1), "lower_bound": fixed(1),
               "gap": percent(2), "peak": fixed(1), "wall": fixed(1)}  # fmt: skip
    columns = [(key, header, formats.get(key, text)) for key, header in COLUMNS_SPEC]
    compared = [row for row in rows if row.get("vs_best") is not None]
    held = all(row["vs_best"] <= 1e-9 for row in compared)
    summary = (f"{len(compared)} caps where a named overlapped baseline fits; the solver at "
               f"most the best of them at every one: {held}.")  # fmt: skip
    write(path, [("", job_lines()), ("", table([display(r) for r in rows], columns)),
                 ("", summary)], argv)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
