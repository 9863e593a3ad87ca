"""scripts/bench_overlap.py on a tiny MoE problem: the solver against the paired baselines."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _bench():  # noqa: ANN202 - the scripts/bench_overlap.py module
    path = ROOT / "scripts" / "bench_overlap.py"
    spec = importlib.util.spec_from_file_location("bench_overlap", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_overlap"] = module
    spec.loader.exec_module(module)
    return module


def test_solver_no_worse_than_paired_baselines() -> None:
    """The solver against the overlapped baseline of its own placement (DualPipe is left
    out: its dual placement, two copies of the parameters, is not one the solver takes, and
    on two devices it has no bubble at all)."""
    bench = _bench()
    fields = dict(pp=2, v=2, microbatches=4, seq=2048, mbs=1, dp=2, ep=2, layers=(1, 1, 2, 2))
    for placement, name in (("v", "dualpipev-overlap"), ("loop", "interleaved-1f1b-a2a")):
        problem = bench.job_problem("deepseek-v3-debug", fields, placement)
        assert problem.pairs
        (row,) = bench.compare(problem, [problem.devices[0].cap], (name,), time_limit=1.0)
        assert row[name]["fits"]
        assert row["best"] == name
        assert row["makespan"] <= row["best_makespan"] * (1 + 1e-9)
        assert row["vs_best"] <= 1e-9
        assert bench.display(row)["vs_best"].endswith(f"vs {name}")
