"""Shared fixtures: small problems that every test module may use."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import networkx as nx
import pytest

from pp_opt.dag import dag_for
from pp_opt.ops import OpKey, OpKind, Stream, stream_of
from pp_opt.order import Order, Variant
from pp_opt.problem import Problem, uniform_problem
from pp_opt.schedule import Schedule
from pp_opt.simulator import simulate

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def _weight(item: pytest.Item) -> int:
    if item.get_closest_marker("torchtitan"):
        return 0
    return 1 if item.get_closest_marker("slow") else 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``pytest -n`` (``make test``), the modules of the longest tests go to the
    workers first, so that none of them is left to run alone at the end; a module keeps
    its own order, and a run without workers keeps the file order."""
    if not getattr(config.option, "numprocesses", None):
        return
    weight: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        weight[module] = min(weight.get(module, 2), _weight(item))
    items.sort(key=lambda item: weight[item.nodeid.split("::")[0]])


@pytest.fixture
def small_problem() -> Problem:
    """p = 4, m = 8, unit costs, cap 2p activations."""
    return uniform_problem(p=4, m=8, t_comm=0.0)


def _forwards_first(key: OpKey) -> tuple[bool, int, int, str]:
    return (key.kind is not OpKind.F, key.microbatch, key.stage, key.kind.value)


def gpipe_schedule(problem: Problem, *, fractions: dict[OpKey, float] | None = None) -> Schedule:
    """Time a GPipe-like hand order: every forward first (by microbatch, then stage), then the rest.

    The per-stream orders are cut from one topological order of the problem's DAG
    (offload ops included when ``problem.offload``), so they can never deadlock.
    """
    dag = dag_for(problem)
    order: dict[tuple[int, Stream], list[OpKey]] = {}
    for key in nx.lexicographical_topological_sort(dag, key=_forwards_first):
        order.setdefault((problem.device_of(key.stage), stream_of(key.kind)), []).append(key)
    return simulate(Order(problem=problem, streams=order, fractions=fractions or {},
                          variant=Variant.of_problem(problem)))  # fmt: skip


@pytest.fixture
def loop_schedule() -> Schedule:
    """GPipe order on p = 4, m = 8, loop placement, split backward, t_comm 0.1."""
    return gpipe_schedule(
        uniform_problem(p=4, m=8, t_w=0.5, m_w=0.4, t_comm=0.1, name="loop-gpipe")
    )


@pytest.fixture
def v_schedule() -> Schedule:
    """GPipe order on p = 4, m = 8, V placement (two chunks per device)."""
    return gpipe_schedule(uniform_problem(p=4, m=8, placement="v", v=2, name="v-gpipe"))


@pytest.fixture
def offload_schedule() -> Schedule:
    """GPipe order with every activation offloaded; odd microbatches move only half of it."""
    base = uniform_problem(p=4, m=6, m_w=0.5, offload=True, name="offload-gpipe")
    problem = base.replace(
        stages=tuple(replace(st, t_offload=1.5, t_reload=1.5) for st in base.stages)
    )
    fractions = {
        OpKey(kind, s, j): 0.5
        for kind in (OpKind.OFFLOAD, OpKind.RELOAD)
        for s in range(problem.num_stages)
        for j in range(1, problem.m, 2)
    }
    return gpipe_schedule(problem, fractions=fractions)
