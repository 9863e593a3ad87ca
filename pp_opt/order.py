"""Op orders: per ``(device, stream)`` the ops in the order they run, and which DAG they use.

An :class:`Order` is what every order generator (:mod:`pp_opt.orders`) returns, what the
simulator times (:func:`pp_opt.simulator.simulate`) and what a timed schedule reduces to
(:func:`pp_opt.simulator.order_of`). It says nothing about time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pp_opt.ops import OpKey, OpKind, Stream, kinds_of
from pp_opt.problem import Problem


class Variant(NamedTuple):
    """Which DAG an order's or a schedule's ops belong to (:func:`pp_opt.dag.dag_for`).

    The problem's switches say what a solver *may* use; a variant says what a given
    order *does* use (a classic schedule runs the fused ``BW`` whatever the problem says).
    """

    split_backward: bool
    """``B`` and ``W`` (True) or one fused ``BW`` (False)."""
    offload: bool
    """The DAG has ``OFFLOAD`` and ``RELOAD`` ops (present only where chosen)."""
    recompute: bool
    """The DAG has ``R`` ops (present only where chosen)."""

    def kinds(self) -> tuple[OpKind, ...]:
        """The op kinds its DAG has (:data:`pp_opt.ops.KINDS` says when each one is)."""
        return kinds_of(self.split_backward, self.offload, self.recompute)

    @classmethod
    def of_problem(cls, problem: Problem) -> Variant:
        """The variant the problem's own switches describe (what a solver schedules)."""
        return cls(problem.split_backward, problem.offload, problem.recompute)

    @classmethod
    def of_kinds(cls, kinds: Iterable[OpKind], *, split_backward: bool = True) -> Variant:
        """The variant a list of op kinds uses (for orders and files that do not say).

        Ops that mix ``BW`` with ``B`` belong to the variant most of their backward ops
        belong to, so one mistyped op is reported as one op, not as every op of the
        other kind; ``split_backward`` decides when there is no backward op at all.
        """
        count = Counter(kinds)
        if count[OpKind.B] or count[OpKind.BW]:
            split_backward = count[OpKind.B] >= count[OpKind.BW]
        return cls(
            split_backward=split_backward,
            offload=bool(count[OpKind.OFFLOAD] or count[OpKind.RELOAD]),
            recompute=bool(count[OpKind.R]),
        )


Streams = Mapping[tuple[int, Stream], Sequence[OpKey]]
"""Per ``(device, stream)``, the ops in the order they run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Order:
    """An op order of one problem: what runs where and in which order, not when."""

    problem: Problem
    """What it orders (a generator may return a re-split problem when its pattern needs
    another placement)."""
    streams: Streams
    """Per ``(device, stream)``, the ops in the order they run."""
    fractions: Mapping[OpKey, float] = field(default_factory=dict)
    """Offloaded fraction of each ``OFFLOAD``/``RELOAD`` op not moving the whole activation."""
    pairs: Mapping[OpKey, OpKey] = field(default_factory=dict)
    """Overlapped pairs (docs/design.md §3): an ``F`` key and its backward half (``B`` or ``BW``
    of the same device). The ``F`` key stands for the pair in its compute stream; the
    backward half is listed nowhere else."""
    waits: tuple[tuple[OpKey, OpKey], ...] = ()
    """Cross-stream waits a runtime performs (CUDA events): ``(a, b)``, ``b`` starts no
    earlier than ``a`` ends."""
    variant: Variant
    """The DAG the ops belong to."""
    name: str = ""
    """How it was made (a generator and its setting), for reports and warm-start names."""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """The parameter setting a searching generator picked (kept in ``solver.extra``)."""

    def keys(self) -> list[OpKey]:
        """Every op of the order, stream by stream."""
        return [key for keys in self.streams.values() for key in keys]


def compute_streams(per_device: Sequence[Sequence[OpKey]]) -> dict[tuple[int, Stream], list[OpKey]]:
    """One compute-stream op list per device, as :data:`Streams`."""
    return {(d, Stream.COMPUTE): list(ops) for d, ops in enumerate(per_device)}
