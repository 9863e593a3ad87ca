"""pp_opt.runtime end to end: 2 and 4 processes on CPU (gloo) run classic, solver
and offload schedules through PyTorch's pipeline runtime; every gradient and loss
must equal the unpipelined model's, and offloaded activations must really leave
the device between their F and their B.

One spawn per process count runs all its schedules (start-up dominates)."""

from __future__ import annotations

import copy
import dataclasses
import json
import multiprocessing
import os
import socket
from collections.abc import Callable
from types import SimpleNamespace

import pytest

torch = pytest.importorskip(
    "torch",
    reason="PyTorch is not installed; pp_opt.runtime needs it (pip install 'pp-opt[torch]')",
)

from order_helpers import overtaking_schedule  # noqa: E402
from torch_pipeline_helpers import (  # noqa: E402
    make_batch,
    make_model,
    make_schedule,
    reference,
    uneven_problem,
    worker,
)

from pp_opt.errors import ProblemError  # noqa: E402
from pp_opt.ops import OpKind  # noqa: E402
from pp_opt.orders import baseline  # noqa: E402
from pp_opt.problem import Problem, uniform_problem  # noqa: E402
from pp_opt.runtime import ActivationOffloader, build_pipeline_schedule, check_stages  # noqa: E402
from pp_opt.runtime_rules import in_runtime_order  # noqa: E402
from pp_opt.schedule import Schedule  # noqa: E402
from pp_opt.schedule_io import dumps_schedule, save_schedule  # noqa: E402
from pp_opt.solvers import solve  # noqa: E402

TESTED_TORCH = ("2.13.",)
pytestmark = pytest.mark.skipif(
    not torch.__version__.startswith(TESTED_TORCH),
    reason=f"the runtime uses underscore pipelining APIs pinned to torch {TESTED_TORCH}",
)

GRAD_TOL = 1e-12
"""float64, same operations in the same order per microbatch: only summation order differs."""


def with_copy_costs(problem: Problem, t_offload: float = 0.3, t_reload: float = 0.3) -> Problem:
    stages = tuple(
        dataclasses.replace(st, t_offload=t_offload, t_reload=t_reload) for st in problem.stages
    )
    return problem.replace(stages=stages, offload=True)


def with_comm(problem: Problem) -> Problem:
    """Communication in every F and B, so that overlapped pairs save time."""
    stages = tuple(dataclasses.replace(st, t_f_comm=0.3 * st.t_f, t_b_comm=0.3 * st.t_b)
                   for st in problem.stages)  # fmt: skip
    return problem.replace(stages=stages)


def cpsat(problem: Problem) -> Schedule:
    return solve(problem, solver="cpsat", time_limit=5, threads=1, seed=0).schedule


SchedulesBuilder = Callable[[], Schedule]

CASES_P2: dict[str, SchedulesBuilder] = {
    "1f1b": lambda: baseline("1f1b", uniform_problem(p=2, m=4, t_comm=0.1)),
    "cpsat-loop": lambda: cpsat(uniform_problem(p=2, m=4, v=2, t_comm=0.1)),
    "cpsat-v": lambda: cpsat(uniform_problem(p=2, m=4, placement="v", v=2, t_comm=0.1)),
    "explicit-uneven": lambda: make_schedule(uneven_problem(), split=True, defer_w=True),
    "offload-hand": lambda: make_schedule(
        with_copy_costs(uniform_problem(p=2, m=4, t_comm=0.1)),
        split=True,
        defer_w=True,
        offload=[(0, 0), (0, 1), (0, 2), (1, 0), (1, 3)],
    ),
    "offload-cpsat": lambda: cpsat(with_copy_costs(uniform_problem(p=2, m=4, t_comm=0.1, cap=1.5))),
    # Issue 11, finding 11: solved offload schedules (both models, the runtimes' order rule)
    # and an overtaking order renumbered for the runtime.
    "milp-offload-allowed": lambda: (
        solve(
            with_copy_costs(uniform_problem(p=2, m=4, t_comm=0.1, cap=1.5)),
            solver="milp",
            time_limit=5,
            threads=1,
            seed=0,
        ).schedule
    ),  # fmt: skip
    "overtaking-renumbered": lambda: in_runtime_order(
        overtaking_schedule(uniform_problem(p=2, m=4, t_comm=0.1))
    ),
    # Overlapped pairs (OVERLAP_F_B actions, run by PyTorch as their halves in sequence).
    "dualpipev-overlap": lambda: baseline(
        "dualpipev-overlap", with_comm(uniform_problem(p=2, m=4, placement="v", v=2, t_comm=0.1))
    ),
    "interleaved-1f1b-a2a": lambda: baseline(
        "interleaved-1f1b-a2a",
        with_comm(uniform_problem(p=2, m=4, v=2, t_comm=0.1, split_backward=False)),
    ),
}
CASES_P4: dict[str, SchedulesBuilder] = {
    "1f1b": lambda: baseline("1f1b", uniform_problem(p=4, m=4, t_comm=0.1)),
    "zb-h1": lambda: baseline("zb-h1", uniform_problem(p=4, m=4, t_comm=0.1)),
    "cpsat-loop": lambda: cpsat(uniform_problem(p=4, m=4, v=2, t_comm=0.1)),
    "cpsat-v": lambda: cpsat(uniform_problem(p=4, m=4, placement="v", v=2, t_comm=0.1)),
    "offload-v": lambda: make_schedule(
        with_copy_costs(uniform_problem(p=4, m=4, placement="v", v=2, t_comm=0.1)),
        split=True,
        offload=[(s, j) for s in range(0, 8, 3) for j in range(4)],
    ),
}
FORMATS = ("compute_only", "compute_comms")
START_METHOD = os.environ.get(
    "PP_OPT_TEST_START_METHOD",
    "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn",
)
"""fork: the children inherit the imported torch (spawn re-imports it, ~10 s a process)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spawn(p: int, builders: dict[str, SchedulesBuilder], tmp) -> dict:
    """Run every case on ``p`` processes; returns per case its schedule and rank results."""
    import torch.multiprocessing as mp

    schedules = {name: build() for name, build in builders.items()}
    cases = [
        {"name": f"{name}/{fmt}", "schedule": dumps_schedule(schedule), "format": fmt}
        for name, schedule in schedules.items()
        for fmt in FORMATS
    ]
    (tmp / "cases.json").write_text(json.dumps(cases))
    args = (p, _free_port(), str(tmp / "cases.json"), str(tmp))
    mp.start_processes(worker, args=args, nprocs=p, start_method=START_METHOD)
    by_case: dict[str, dict] = {
        c["name"]: {"schedule": schedules[c["name"].split("/")[0]], "ranks": []} for c in cases
    }
    for rank in range(p):
        for result in json.loads((tmp / f"rank{rank}.json").read_text()):
            by_case[result["name"]]["ranks"].append(result)
    return by_case


@pytest.fixture(scope="module")
def results_p2(tmp_path_factory):
    return _spawn(2, CASES_P2, tmp_path_factory.mktemp("p2"))


@pytest.fixture(scope="module")
def results_p4(tmp_path_factory):
    return _spawn(4, CASES_P4, tmp_path_factory.mktemp("p4"))


def _results(request, p: int) -> dict:
    return request.getfixturevalue(f"results_p{p}")


ALL_CASES = [(2, n, f) for n in CASES_P2 for f in FORMATS] + [
    (4, n, f) for n in CASES_P4 for f in FORMATS
]


@pytest.mark.slow
@pytest.mark.parametrize(("p", "name", "fmt"), ALL_CASES, ids=lambda v: str(v))
def test_gradients_and_losses_equal_unpipelined(request, p, name, fmt):
    case = _results(request, p)[f"{name}/{fmt}"]
    assert len(case["ranks"]) == p
    for rank in case["ranks"]:
        assert rank["grad_err"] <= GRAD_TOL, rank
        assert rank["loss_err"] <= GRAD_TOL, rank
    assert sum(r["has_last"] for r in case["ranks"]) == 1


OFFLOAD_CASES = [(p, n, f) for p, n, f in ALL_CASES if n.startswith("offload")]


@pytest.mark.slow
@pytest.mark.parametrize(("p", "name", "fmt"), OFFLOAD_CASES, ids=lambda v: str(v))
def test_offloaded_activations_left_the_device(request, p, name, fmt):
    case = _results(request, p)[f"{name}/{fmt}"]
    schedule = case["schedule"]
    wanted = {(op.stage, op.microbatch) for op in schedule.ops if op.kind is OpKind.OFFLOAD}
    assert wanted, "the case must offload something"
    for rank in case["ranks"]:
        for step in rank["offload_events"]:  # two steps: the second must behave the same
            seen = {(e["stage"], e["microbatch"]) for e in step}
            mine = {(s, j) for s, j in wanted if schedule.problem.device_of(s) == rank["rank"]}
            assert seen == mine
            for pair in mine:
                events = [e for e in step if (e["stage"], e["microbatch"]) == pair]
                assert [e["action"] for e in events] == ["offload", "reload", "unpack"]
                off, back, used = events
                # the saved intermediate left: moved to the host store, original freed
                assert off["tensors"] >= 1 and off["freed"] == off["tensors"]
                assert set(off["locations"]) == {"host"}
                # and came back before the backward read it
                assert back["tensors"] == off["tensors"] and set(back["locations"]) == {"device"}
                assert used["tensors"] == off["tensors"] and set(used["locations"]) == {"device"}


# ---------------------------------------------------------------- in-process checks


def _stub_stages(problem: Problem, rank: int, stages=None, num_stages=None, group_size=None):
    return [
        SimpleNamespace(
            stage_index=s,
            num_stages=num_stages or problem.num_stages,
            group_size=group_size or problem.p,
            group_rank=rank,
        )
        for s in (problem.stages_on(rank) if stages is None else stages)
    ]


def test_mismatched_stages_are_refused_naming_what():
    schedule = baseline("1f1b", uniform_problem(p=2, m=4))
    problem = schedule.problem
    check_stages(schedule, _stub_stages(problem, 1), n_microbatches=4)
    with pytest.raises(ProblemError, match="num_stages=3"):
        check_stages(schedule, _stub_stages(problem, 0, num_stages=3))
    with pytest.raises(ProblemError, match="^p: .*4 ranks"):
        check_stages(schedule, _stub_stages(problem, 0, group_size=4))
    with pytest.raises(ProblemError, match="^placement: rank 0 holds stages \\[1\\]"):
        check_stages(schedule, _stub_stages(problem, 0, stages=[1]))
    with pytest.raises(ProblemError, match="^m: .*8 microbatches"):
        check_stages(schedule, _stub_stages(problem, 0), n_microbatches=8)
    with pytest.raises(ProblemError, match="format"):
        build_pipeline_schedule(schedule, _stub_stages(problem, 0), loss_fn=None, format="x")


def test_offloader_moves_saved_tensors_and_gradients_survive():
    """One process, no pipeline: capture a forward, offload, reload, backward."""
    model = make_model(2, seed=3)
    x, y = make_batch(1, seed=3)
    _, expected = reference(copy.deepcopy(model), x, y, 1)
    offloader = ActivationOffloader(torch.device("cpu"), record=True)
    with offloader.capture(0, 0):
        out = model(x)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    offloader.offload(0, 0, keep=params | {x.untyped_storage().data_ptr()})
    off = offloader.events[-1]
    # per chunk: the first Tanh output (saved twice, stored once), the second's, and the
    # first chunk's output that the second chunk saves; 3 intermediates + the model output
    assert off.tensors == 4 and set(off.locations) == {"host"}
    offloader.reload(0, 0)
    torch.nn.functional.mse_loss(out, y).backward()
    assert [e.action for e in offloader.events] == ["offload", "reload", "unpack"]
    for name, param in model.named_parameters():
        assert torch.equal(param.grad, expected[name])


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
        ),
    ],
)
def test_offload_copies_to_host_memory_and_back(device, caplog):
    """On CUDA the copy is pinned host memory on a side stream; a backward that runs
    before its RELOAD still gets its tensors (reloaded then, with a warning)."""
    model = make_model(1, seed=5).to(device)
    x, y = (t.to(device) for t in make_batch(1, seed=5))
    _, expected = reference(copy.deepcopy(model), x, y, 1)
    offloader = ActivationOffloader(torch.device(device), record=True)
    with offloader.capture(0, 0):
        out = model(x)
    keep = {p.untyped_storage().data_ptr() for p in model.parameters()}
    keep |= {x.untyped_storage().data_ptr(), out.untyped_storage().data_ptr()}
    offloader.offload(0, 0, keep=keep)
    moved = [h for ref in offloader._saved[(0, 0)] if (h := ref()) is not None and h.moved]
    assert len(moved) == 1 and moved[0].tensor.device.type == "cpu"
    if device == "cuda":
        assert moved[0].tensor.is_pinned()
    with caplog.at_level("WARNING", logger="pp_opt.runtime.offload"):
        torch.nn.functional.mse_loss(out, y).backward()  # no reload: the unpack does it
    assert "before its RELOAD" in caplog.text
    assert moved[0].tensor.device.type == torch.device(device).type
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, expected[name], rtol=0, atol=1e-12)


def test_partial_offload_moves_about_that_fraction():
    model = make_model(1, seed=4)
    x, _ = make_batch(2, seed=4)
    offloader = ActivationOffloader(torch.device("cpu"), record=True)
    with offloader.capture(0, 0):
        model(x).sum()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    offloader.offload(0, 0, fraction=0.5, keep=params | {x.untyped_storage().data_ptr()})
    assert offloader.events[-1].tensors == 1  # of the two saved Tanh outputs


@pytest.mark.slow
def test_torchrun_example_trains_a_schedule(tmp_path):
    """examples/torchrun_train.py as a user runs it: torchrun, 2 CPU processes, offload."""
    import subprocess
    import sys

    from conftest import EXAMPLES

    path = tmp_path / "schedule.json"
    save_schedule(CASES_P2["offload-hand"](), path)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-port", str(_free_port()), str(EXAMPLES / "torchrun_train.py"),
               str(path), "--steps", "2", "--width", "8", "--format", "compute_comms"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 1: loss" in done.stdout
    assert "activations went to host memory and back" in done.stdout
