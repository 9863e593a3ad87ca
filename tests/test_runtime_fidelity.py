"""Predicted vs measured, end to end on CPU: a real decoder profiled, scheduled and run on
2 gloo processes through PyTorch's pipeline runtime (gradients equal the unpipelined
decoder's; timed interleaved rounds; runtime op times; re-timing), and the example's two
steps as a user runs them (plan, then run on 2 processes started as torchrun starts them)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
import multiprocessing
import os
import socket

import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'pp-opt[torch]')")

from conftest import EXAMPLES  # noqa: E402
from torch_pipeline_helpers import decoder_worker  # noqa: E402

from pp_opt.errors import ProblemError  # noqa: E402
from pp_opt.ops import OpKind  # noqa: E402
from pp_opt.problem_io import problem_from_costs  # noqa: E402
from pp_opt.profiler import profile_costs  # noqa: E402
from pp_opt.profiler.cards import model_card_from_dict  # noqa: E402
from pp_opt.runtime.plans import plan_schedule, plan_schedules, with_measured_times  # noqa: E402
from pp_opt.schedule_io import dumps_schedule  # noqa: E402

pytestmark = pytest.mark.skipif(
    not torch.__version__.startswith("2.13."),
    reason="the runtime uses underscore pipelining APIs pinned to torch 2.13",
)
TINY = dict(layers=2, hidden=32, heads=2, vocab=64, seq=16, dtype="fp32")
NAMES = ("1f1b", "zb-h1-offload")
START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_problem():
    torch.set_num_threads(1)
    card = model_card_from_dict(TINY, "tiny")
    costs = profile_costs(model=card, pp=2, microbatches=4, measure=True, repeats=1, warmup=0)
    problem = problem_from_costs(costs)
    # The runtime is under test, not the copy timings: one repeat measured on a busy machine
    # can leave the offload schedule no room for a copy, so copies are pinned short.
    stages = tuple(dataclasses.replace(st, t_offload=0.01, t_reload=0.01) for st in problem.stages)
    return problem.replace(stages=stages)


@pytest.fixture(scope="module")
def decoder_runs(tiny_problem, tmp_path_factory):
    import torch.multiprocessing as mp

    tmp = tmp_path_factory.mktemp("decoder")
    schedules = plan_schedules(tiny_problem, NAMES)
    job = {"card": TINY, "schedules": {n: dumps_schedule(s) for n, s in schedules.items()}}
    (tmp / "job.json").write_text(json.dumps(job))
    mp.start_processes(decoder_worker, args=(2, _free_port(), str(tmp / "job.json"), str(tmp)),
                       nprocs=2, start_method=START_METHOD)  # fmt: skip
    ranks = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]
    return schedules, ranks


@pytest.mark.slow
def test_decoder_gradients_equal_the_unpipelined_decoder(decoder_runs):
    _, ranks = decoder_runs
    for rank in ranks:
        for name in NAMES:
            assert rank["grad_err"][name] < 1e-5, (name, rank["grad_err"])


@pytest.mark.slow
def test_interleaved_rounds_report_iterations_ranks_and_op_times(decoder_runs):
    schedules, ranks = decoder_runs
    assert schedules["zb-h1-offload"].problem.offload
    assert any(op.kind is OpKind.OFFLOAD for op in schedules["zb-h1-offload"].ops)
    compare = ranks[0]["compare"]
    for name in NAMES:
        got = compare[name]
        assert got["per_step"] == ranks[1]["compare"][name]["per_step"]  # gathered on every rank
        assert len(got["per_step"]) == 2 and len(got["per_round"]) == 2  # warm-up step left out
        assert got["iteration"]["median"] == pytest.approx(sum(got["per_step"]) / 2)
        assert [r["rank"] for r in got["ranks"]] == [0, 1]
        assert got["losses"] and all(loss > 0 for loss in got["losses"])
    # fused backward in 1F1B (PyTorch's B), split in ZB-H1 (I and W); F everywhere
    assert {"F0", "F1", "BW0", "BW1"} <= set(compare["1f1b"]["actions"])
    assert {"F0", "F1", "B0", "W0", "B1", "W1"} <= set(compare["zb-h1-offload"]["actions"])
    # each round's profile: every stage's ops, gathered from both ranks
    assert len(ranks[0]["profiles"]) == 2 and ranks[0]["profiles"] == ranks[1]["profiles"]
    assert set(ranks[0]["profiles"][0]) == {
        f"{k}{s}" for k in ("F", "B", "W", "BW") for s in (0, 1)
    }
    retimed = with_measured_times(schedules["1f1b"], compare["1f1b"]["actions"])
    assert retimed.problem.stages[0].t_f == compare["1f1b"]["actions"]["F0"]
    assert retimed.metrics.makespan > 0


def test_plan_names_and_offload(tiny_problem):
    with pytest.raises(ProblemError, match="^schedule: unknown 'nope'; use one of cpsat"):
        plan_schedule(tiny_problem, "nope")
    fused = plan_schedule(tiny_problem, "cpsat-fused", time_limit=2)
    assert {op.kind for op in fused.ops} == {OpKind.F, OpKind.BW}


def _example():
    spec = importlib.util.spec_from_file_location(
        "pipeline_decoder", EXAMPLES / "pipeline_decoder.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _example_rank(rank: int, port: int, argv: list[str], out: str) -> None:
    """One process as torchrun starts it (same environment variables), running the example."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    with open(f"{out}/rank{rank}.txt", "w") as f, contextlib.redirect_stdout(f):
        _example().main(argv)


@pytest.mark.slow
def test_example_plans_then_runs_as_under_torchrun(tmp_path, monkeypatch):
    """examples/pipeline_decoder.py as its docstring says: ``plan``, then ``run`` on 2 ranks."""
    import torch.multiprocessing as mp

    card = tmp_path / "tiny.toml"
    card.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in TINY.items()))
    plan = ["plan", "--model", str(card), "--pp", "2", "-m", "4", "--schedule", "1f1b",
            "--repeats", "1", "--warmup", "0", "-o", str(tmp_path)]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()) as planned:
        _example().main(plan)
    assert "next: torchrun --nproc-per-node 2 " in planned.getvalue()
    schedule = str(tmp_path / "schedule.json")
    argv = ["run", schedule, "--steps", "3", "--warmup-steps", "1"]
    mp.start_processes(_example_rank, args=(_free_port(), argv, str(tmp_path)), nprocs=2,
                       start_method=START_METHOD)  # fmt: skip
    out = (tmp_path / "rank0.txt").read_text()
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["0", "1", "2"] and rows[0][-1] == "(warm-up)"
    assert "after 1 warm-up steps: measured" in out and "optimizer step" in out
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(SystemExit, match="launch it with torchrun --nproc-per-node 2"):
        _example().main(argv)
