"""The orders the memory caps force (:mod:`pp_opt.solvers.cpsat.memory_order`, issue 28).

- A closed form: on the issue-18 ``v`` family at cap 2.5 (p 4), device 0 holds stages 0
  and 7; at the start of ``F(7, j)`` the forwards ``F(0, 0..j)`` and ``F(7, 0..j)`` hold
  ``j + 1`` activations, and only the lifetimes of microbatches before ``k`` can be freed
  while ``B(7, k)`` has not ended, so ``B(7, j - 2)`` must end first (``j + 1 - (j - 2) = 3
  > 2.5``).
- Every forced pair holds in valid schedules of those instances (rule schedules and a
  solved one), each renumbered in the microbatch order the symmetry breaking assumes and
  with its alike ``W`` in the order of their backwards (:mod:`~pp_opt.solvers.cpsat.w_order`).
- With the forced orders the model still proves the known optima (the README's table).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest
from families import exact_family
from ortools.sat.python import cp_model

from pp_opt import baseline
from pp_opt.dag import dag_for
from pp_opt.ops import OpKey, OpKind
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, ScheduledOp
from pp_opt.solvers import solve
from pp_opt.solvers.base import SolveOptions
from pp_opt.solvers.cpsat.constraints import symmetry_chains
from pp_opt.solvers.cpsat.model import build_model
from pp_opt.solvers.cpsat.sequence import add_memory_orders
from pp_opt.solvers.cpsat.w_order import in_w_order, w_class


def _forced(problem: Problem) -> list[tuple[OpKey, OpKey]]:
    """The forced orders given the microbatch order only (not the slot exchanges of
    :mod:`~pp_opt.solvers.cpsat.exchange`, which rule schedules need not keep)."""
    dag = dag_for(problem)
    built = build_model(problem, dag, SolveOptions())
    chains = [
        (a, b) for a, b in symmetry_chains(built.vars) if (a.kind, a.stage) == (b.kind, b.stage)
    ]
    return add_memory_orders(cp_model.CpModel(), built.vars, dag, chains)


def _in_microbatch_order(schedule: Schedule) -> dict[OpKey, ScheduledOp]:
    """The schedule's compute ops, each kind of each stage renumbered by start (the
    renumbering :func:`~pp_opt.solvers.cpsat.constraints.add_symmetry_breaking` keeps)."""
    groups: dict[tuple[OpKind, int], list[ScheduledOp]] = defaultdict(list)
    for op in schedule.ops:
        groups[(op.kind, op.stage)].append(op)
    out = {}
    for (kind, stage), ops in groups.items():
        for j, op in enumerate(sorted(ops, key=lambda o: (o.start, o.microbatch))):
            out[OpKey(kind, stage, j)] = replace(op, microbatch=j)
    return _alike_w_in_backward_order(out, schedule.problem)


def _alike_w_in_backward_order(
    ops: dict[OpKey, ScheduledOp], problem: Problem
) -> dict[OpKey, ScheduledOp]:
    """The same ops with each device's ``W`` slots given to their owners in the order of
    the ``B`` (the reassignment :mod:`pp_opt.solvers.cpsat.w_order` keeps)."""
    by_device: dict[int, list[OpKey]] = defaultdict(list)
    for key, op in ops.items():
        by_device[problem.device_of(op.stage)].append(key)
    out = dict(ops)
    for keys in by_device.values():
        seq = sorted(keys, key=lambda k: ops[k].start)
        for slot, owner in zip(seq, in_w_order(seq, w_class(problem)), strict=True):
            if slot != owner:
                out[owner] = replace(ops[slot], stage=owner.stage, microbatch=owner.microbatch)
    return out


def test_the_turn_of_the_v_waits_for_the_backward_two_microbatches_back() -> None:
    forced = set(_forced(exact_family(4, 8, 2.5)))
    for j in range(2, 8):
        assert (OpKey(OpKind.B, 7, j - 2), OpKey(OpKind.F, 7, j)) in forced
        assert (OpKey(OpKind.B, 7, j - 1), OpKey(OpKind.F, 7, j)) not in forced


@pytest.mark.parametrize("p,m,cap", [(3, 6, 2.5), (3, 6, 2.0), (4, 8, 2.5), (4, 8, 3.0)])
def test_forced_orders_hold_in_valid_schedules(p: int, m: int, cap: float) -> None:
    problem = exact_family(p, m, cap)
    forced = _forced(problem)
    assert forced
    schedules = [baseline(name, problem) for name in ("v-half", "v-min")]
    if (p, m) == (3, 6):
        schedules.append(solve(problem, time_limit=5, threads=2, seed=0).schedule)
    for schedule in schedules:
        ops = _in_microbatch_order(schedule)
        for y, x in forced:
            assert ops[y].end <= ops[x].start + 1e-9, (schedule.solver, y, x)


@pytest.mark.parametrize("cap,optimum", [(2.0, 19.30), (2.5, 18.00)])
def test_the_model_with_forced_orders_proves_the_known_optima(cap: float, optimum: float) -> None:
    result = solve(exact_family(3, 6, cap), time_limit=20, threads=2, seed=0)
    assert str(result.status) == "optimal"
    assert result.objective == pytest.approx(optimum, abs=1e-6)
