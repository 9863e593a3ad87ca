"""What a rule generator returns: the pieces of an order, and the one place they are timed.

The generators of this package return :class:`OrderPieces`: the problem they
schedule (re-split when their pattern needs another placement), the op order per
``(device, stream)``, the offload fraction of each copy that moves only part of an
activation, and the cross-stream waits (``(a, b)``: ``b`` starts no earlier than
``a`` ends). :func:`to_schedule` is the only place here that turns pieces into a
timed schedule, so moving to another simulator entry point is a one-line change.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import networkx as nx

from pp_opt.ops import OpKey, Stream
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, SolverInfo
from pp_opt.simulator import simulate

Streams = dict[tuple[int, Stream], list[OpKey]]


class OrderPieces(NamedTuple):
    """The parts of an order (the fields of the orders package's ``Order``)."""

    problem: Problem
    """The problem the order is for."""
    streams: Streams
    """Per ``(device, stream)``, the ops in run order."""
    fractions: Mapping[OpKey, float]
    """Offload fraction of each OFFLOAD/RELOAD that moves less than the whole activation."""
    waits: tuple[tuple[OpKey, OpKey], ...]
    """Cross-stream waits: ``(a, b)`` means ``b`` starts no earlier than ``a`` ends."""
    name: str = ""
    """The generator (e.g. ``v-half``)."""
    settings: Mapping[str, Any] = {}
    """The parameter setting the generator picked (for reports and provenance)."""


def compute_pieces(problem: Problem, per_device: Sequence[Sequence[OpKey]], name: str,
                   settings: Mapping[str, Any]) -> OrderPieces:  # fmt: skip
    """Pieces of a compute-only order (no copies, no waits)."""
    streams = {(d, Stream.COMPUTE): list(ops) for d, ops in enumerate(per_device)}
    return OrderPieces(problem, streams, {}, (), name, dict(settings))


def to_schedule(pieces: OrderPieces, *, seconds: float | None = None,
                dag: nx.DiGraph | None = None) -> Schedule:  # fmt: skip
    """Time the pieces with the simulator (not validated: callers check it).

    ``solver.extra`` keeps the generator's setting; ``seconds`` is the time the
    generator took, when known; ``dag`` the problem's DAG when the caller has built
    it (with the op kinds the pieces use), to save rebuilding it.
    """
    started = time.perf_counter()
    info = SolverInfo(name=pieces.name or "rule", status="heuristic", objective=0.0,
                      extra={"settings": dict(pieces.settings)})  # fmt: skip
    schedule = simulate(pieces.problem, pieces.streams, fractions=dict(pieces.fractions),
                        waits=pieces.waits, solver=info, dag=dag)  # fmt: skip
    info.seconds = seconds if seconds is not None else time.perf_counter() - started
    return schedule
