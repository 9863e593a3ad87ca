"""Benchmark the solvers against the classic schedules (issue 3, Measure).

Parts (``--parts``, comma separated):

- ``paper``: the classic schedules on the four Zero Bubble configurations, simulated with the
  paper's costs, beside the paper's bubble rates (docs/design.md §7); no solve, a few seconds.
- ``configs``: the four Zero Bubble configurations of docs/design.md §7 at caps
  ``p·M_B`` and ``2p·M_B``, objectives ``span`` and ``makespan``, placements
  ``loop`` (v = 1) and ``v``: every classic schedule and pp_opt.
- ``offload``: ``t_f = t_b = t_w = 1``, ``t_comm = 0.05``, ``p = 8``, ``m = 32``,
  full-activation copy time ``3k`` for ``k`` in {0.5, 1.0}, caps ``p·M_B/2`` and
  ``p·M_B/4``, against the best no-offload makespan at ``p·M_B``.
- ``scale``: solve time and gap for ``p`` in {4, 8, 16, 32, 64}, ``m = 4p``.
- ``tight`` (issue 10): the memory-tight instances of ``scripts/tight_instances.py``
  against the Zero Bubble repo's rule schedules (``scripts/anchors.json``): anchor,
  pp_opt, bound, gap, offloads, wall seconds, and whether the solve kept its time limit
  (``limit * 1.05 + 2 s``).
- ``exact`` (issue 18): the small tight-memory ``v`` instances of
  ``scripts/tight_instances.py`` (``EXACT``) against V-Half, V-Min and ZB-V, with
  status, bound and gap (each solve gets ``--time-limit``); the span instance (CP-SAT,
  10 s); the ``v`` offload instance (m 12) at cap 2 against its no-offload makespan at cap 3.
- ``v-offload`` (issue 28): the same ``v`` offload family at m 12, 16, 24 and 32, each
  printing both makespans and their ratio.
- ``offload-target`` (issue 10): the PipeOffload instance at half of ZB-V's cap
  (``k`` = 0.5 and 1) against the same instance without offload at ZB-V's full cap, and
  idle fractions against PipeOffload's at the same cap.

Prints a table and writes JSON (``--json``), and Markdown for the docs (``--markdown``, with the
command, commit, date and machine). Example::

    python scripts/bench_solvers.py --parts configs --time-limit 20 --json bench.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pp_opt.errors import InfeasibleError, PPOptError
from pp_opt.ops import OpKind
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


PAPER_RATES = {
    "zb-1.5b": {"1f1b": 0.2431, "zb-h1": 0.1585, "zb-h2": 0.1083, "zb-v": 0.0702,
                "interleaved-1f1b": 0.1395},
    "zb-6.2b": {"1f1b": 0.2347, "zb-h1": 0.1323, "zb-h2": 0.0698},
    "zb-14.6b": {"1f1b": 0.2552, "zb-h1": 0.1397, "zb-h2": 0.0672},
    "zb-28.3b": {"1f1b": 0.2646, "zb-h1": 0.1421, "zb-h2": 0.0641},
}  # fmt: skip
"""The Zero Bubble paper's bubble rates (its Table and docs/design.md §7; ZB-V and
interleaved 1F1B on the 1.5B costs from the same simulation)."""
PAPER_SCHEDULES = ("1f1b", "zb-h1", "zb-h2", "zb-v", "interleaved-1f1b")


def part_paper(args: argparse.Namespace) -> list[dict]:
    """Each classic schedule at the paper's costs, its bubble rate beside the published one."""
    rows = []
    for config in args.configs:
        problem = load_problem(ROOT / "examples" / f"{config}.toml")
        for name in PAPER_SCHEDULES:
            t0 = time.perf_counter()
            row = row_of(config, name, baseline(name, problem), time.perf_counter() - t0)
            row["published"] = PAPER_RATES.get(config, {}).get(name)
            print_row(row)
            rows.append(row)
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


def _tight_module():  # noqa: ANN202 - the scripts/tight_instances.py module
    sys.path.insert(0, str(ROOT / "scripts"))
    import tight_instances

    return tight_instances


def _solve_row(name: str, problem: Problem, args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    result = solve(problem, solver=args.solver, time_limit=args.time_limit, threads=args.threads,
                   seed=args.seed, offload_fractions=args.fractions)  # fmt: skip
    wall = time.perf_counter() - t0
    schedule = result.schedule
    return {
        "instance": name,
        "status": str(result.status),
        "makespan": schedule.metrics.makespan,
        "objective": result.objective,
        "lower_bound": result.lower_bound,
        "gap": result.gap,
        "offloads": sum(1 for op in schedule.ops if op.kind is OpKind.OFFLOAD),
        "idle_fraction": schedule.metrics.idle_fraction,
        "peak_memory": max(schedule.metrics.peak_memory),
        "warm_start": result.warm_start.name if result.warm_start else None,
        "wall": wall,
        "within_limit": wall <= args.time_limit * 1.05 + 2.0,
    }


def part_tight(args: argparse.Namespace) -> list[dict]:
    tight = _tight_module()
    anchors = json.loads((ROOT / "scripts" / "anchors.json").read_text())["rows"]
    print(f"{'instance':<26} {'anchor':>9} {'(offl)':>6} {'pp_opt':>9} {'(offl)':>6} "
          f"{'vs anchor':>9} {'bound':>9} {'gap':>7} {'wall':>6} limit")  # fmt: skip
    rows = []
    for anchor in anchors:
        row = _solve_row(anchor["name"], tight.INSTANCES[anchor["name"]](), args)
        row["anchor"] = anchor["anchor_makespan"]
        row["anchor_offloads"] = anchor["offloads"]
        row["below_anchor"] = 1 - row["makespan"] / row["anchor"]
        print(f"{row['instance']:<26} {row['anchor']:>9.2f} {row['anchor_offloads']:>6} "
              f"{row['makespan']:>9.2f} {row['offloads']:>6} {-row['below_anchor']:>+9.2%} "
              f"{row['lower_bound']:>9.2f} {row['gap']:>7.2%} {row['wall']:>6.1f} "
              f"{'ok' if row['within_limit'] else 'OVER'}", flush=True)  # fmt: skip
        rows.append(row)
    return rows


def part_offload_target(args: argparse.Namespace) -> list[dict]:
    tight = _tight_module()
    full_cap = 8.0  # ZB-V's cap: p whole-device activations
    reference = _solve_row("no offload, cap 8", tight.pipeoffload_instance(1.0, full_cap).replace(
        offload=False), args)  # fmt: skip
    anchors = {a["name"]: a for a in json.loads((ROOT / "scripts" / "anchors.json").read_text())[
        "rows"]}  # fmt: skip
    print(
        f"reference (no offload, cap {full_cap:g}): {reference['makespan']:.2f} "
        f"idle {reference['idle_fraction']:.4f}",
        flush=True,
    )
    rows = [reference]
    for k in (0.5, 1.0):
        row = _solve_row(f"k={k:g} cap 4", tight.pipeoffload_instance(k, full_cap / 2), args)
        row["vs_no_offload"] = row["makespan"] / reference["makespan"] - 1
        anchor = anchors.get("pipeoffload-k1-cap4") if k == 1.0 else None
        if anchor is not None:
            busy = 3 * 0.25 * 4 * 32  # F + B + W of 4 chunks, 32 microbatches, per device
            row["pipeoffload_idle"] = 1 - busy / anchor["anchor_makespan"]
        print(f"{row['instance']:<12} {row['makespan']:.2f} ({row['offloads']} offloads) "
              f"{row['vs_no_offload']:+.2%} vs no offload; idle {row['idle_fraction']:.4f}"
              + (f" vs PipeOffload {row['pipeoffload_idle']:.4f}" if "pipeoffload_idle" in row
                 else "") + f"; wall {row['wall']:.1f}", flush=True)  # fmt: skip
        rows.append(row)
    return rows


def _rule_makespan(name: str, problem: Problem) -> float | str:
    try:
        return baseline(name, problem).metrics.makespan
    except InfeasibleError as err:
        return f"over cap (needs {err.min_cap:.3g})"
    except PPOptError as err:
        return f"n/a: {err}"


def _cell(value: float | str) -> str:
    return f"{value:.2f}" if isinstance(value, float) else "over" if "over" in value else "-"


def part_exact(args: argparse.Namespace) -> list[dict]:
    tight = _tight_module()
    rows = []
    print(f"{'instance':<22} {'ops':>4} {'V-Half':>7} {'V-Min':>7} {'ZB-V':>7} {'pp_opt':>7} "
          f"{'bound':>7} {'status':<9} {'gap':>6} {'wall':>6} limit")  # fmt: skip
    for p, m, cap in tight.EXACT:
        problem = tight.exact_instance(p, m, cap)
        row = _solve_row(problem.name, problem, args)
        row.update(p=p, m=m, cap=cap, ops=3 * 2 * p * m)
        for rule in ("v-half", "v-min", "zb-v"):
            row[rule] = _rule_makespan(rule, problem)
        done = row["status"] == "optimal" or row["wall"] >= args.time_limit * 0.95
        row["to_limit_or_proof"] = done
        print(f"{row['instance']:<22} {row['ops']:>4} {_cell(row['v-half']):>7} "
              f"{_cell(row['v-min']):>7} {_cell(row['zb-v']):>7} {row['makespan']:>7.2f} "
              f"{row['lower_bound']:>7.2f} {row['status']:<9} {row['gap']:>6.2%} "
              f"{row['wall']:>6.1f} {'ok' if row['to_limit_or_proof'] else 'EARLY'}",
              flush=True)  # fmt: skip
        rows.append(row)
    span_args = argparse.Namespace(**{**vars(args), "time_limit": min(10.0, args.time_limit)})
    span = _solve_row(tight.span_instance().name, tight.span_instance(), span_args)
    span["objective_kind"] = "span"
    print(f"{span['instance']}: span {span['objective']:.2f} bound {span['lower_bound']:.2f} "
          f"{span['status']} in {span['wall']:.1f} s (limit 10)", flush=True)  # fmt: skip
    rows.append(span)
    return rows + v_offload_rows(args, (12,))


def v_offload_rows(args: argparse.Namespace, ms: tuple[int, ...]) -> list[dict]:
    """The ``v`` offload instance at cap 2 against its no-offload makespan at cap 3, per m."""
    tight = _tight_module()
    rows = []
    for m in ms:
        reference = _solve_row(f"v offload m={m} reference (cap 3, no offload)",
                               tight.v_offload_instance(3.0, offload=False, m=m), args)  # fmt: skip
        offload = _solve_row(f"v offload m={m} cap 2", tight.v_offload_instance(2.0, m=m), args)
        offload["m"] = reference["m"] = m
        offload["vs_reference"] = offload["makespan"] / reference["makespan"] - 1
        rows += [reference, offload]
        print(f"v offload m={m}: cap 2 with offload {offload['makespan']:.2f} "
              f"({offload['offloads']} offloads, {offload['status']}, {offload['wall']:.1f} s) vs "
              f"cap 3 without {reference['makespan']:.2f} ({reference['wall']:.1f} s): "
              f"ratio {offload['makespan'] / reference['makespan']:.4f} "
              f"({offload['vs_reference']:+.2%})", flush=True)  # fmt: skip
    return rows


def part_v_offload(args: argparse.Namespace) -> list[dict]:
    """Issue 28: the ``v`` offload family at each ``--v-offload-m`` (default ``V_OFFLOAD_M``:
    12, 16, 24, 32)."""
    ms = args.v_offload_m or _tight_module().V_OFFLOAD_M
    return v_offload_rows(args, tuple(ms))


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
    parser.add_argument("--v-offload-m", default="", help="m of --parts v-offload, e.g. 16,32.")
    parser.add_argument("--markdown", type=Path, default=None, help="Write the rows as Markdown.")
    args = parser.parse_args(argv)
    args.configs = [c for c in args.configs.split(",") if c]
    args.scale_p = [int(x) for x in args.scale_p.split(",") if x]
    args.v_offload_m = [int(x) for x in args.v_offload_m.split(",") if x]
    args.fractions = tuple(float(x) for x in args.fractions.split(","))
    print(" ".join(f"{h:<10}" for h in HEADER))
    rows: list[dict] = []
    parts = {"paper": part_paper, "configs": part_configs, "offload": part_offload,
             "scale": part_scale, "tight": part_tight, "offload-target": part_offload_target,
             "exact": part_exact, "v-offload": part_v_offload}  # fmt: skip
    for part in args.parts.split(","):
        if part not in parts:
            print(f"unknown part {part!r}; use {', '.join(parts)}", file=sys.stderr)
            return 2
        rows += parts[part](args)
    if args.json is not None:
        args.json.write_text(json.dumps({"time_limit": args.time_limit, "threads": args.threads,
                                         "rows": rows}, indent=1))  # fmt: skip
        print(f"wrote {args.json}")
    if args.markdown is not None:
        write_markdown(args.markdown, rows, argv)
    return 0


def write_markdown(path: Path, rows: list[dict], argv: list[str] | None) -> None:
    """The rows as the docs show them, under the line that says how they were made."""
    from bench_markdown import fixed, percent, table, text, write

    columns = [("instance", "instance", text), ("schedule", "schedule", text),
               ("ops", "ops", text), ("cap", "cap", text), ("anchor", "anchor", fixed(2)),
               ("v-half", "V-Half", fixed(2)), ("v-min", "V-Min", fixed(2)),
               ("zb-v", "ZB-V", fixed(2)), ("status", "status", text),
               ("needs", "needs cap", fixed(3)),
               ("makespan", "makespan", fixed(2)), ("span", "span", fixed(2)),
               ("bubble_rate", "bubble rate", fixed(4)), ("published", "published", fixed(4)),
               ("below_anchor", "below anchor", percent(1)),
               ("vs_reference", "vs reference", percent(1)), ("offloads", "offloads", text),
               ("peak_memory", "peak", fixed(3)), ("lower_bound", "lower bound", fixed(2)),
               ("gap", "gap", percent(2)), ("seconds", "seconds", fixed(1)),
               ("wall", "wall s", fixed(1))]  # fmt: skip
    shown = [c for c in columns if any(row.get(c[0]) is not None for row in rows)]
    write(path, [("", table(rows, shown))], argv)


if __name__ == "__main__":
    sys.exit(main())
