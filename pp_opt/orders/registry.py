"""Every order generator by name: what ``pp-opt baseline NAME`` runs and what warm starts try.

The order of :data:`REGISTRY` matters: warm-start candidates of equal objective are
taken in this order, and :func:`pp_opt.orders.baseline_names` lists the baselines in it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pp_opt.errors import ProblemError
from pp_opt.orders.common import OrderGenerator
from pp_opt.orders.greedy.zb_greedy import zb_greedy
from pp_opt.orders.greedy.zb_v_greedy import zb_v_greedy
from pp_opt.orders.memory.controllable_memory import v_half, v_min
from pp_opt.orders.memory.list_schedules import (
    fallback,
    greedy_bfw,
    greedy_bfw_limited,
    greedy_bfw_older_first,
    greedy_lazy_w,
)
from pp_opt.orders.memory.pipeoffload import pipeoffload
from pp_opt.orders.patterns.classic import gpipe, interleaved_1f1b, one_f_one_b
from pp_opt.orders.patterns.overlapped import (
    dual_pipe,
    dual_pipe_v_overlapped,
    interleaved_1f1b_a2a,
)
from pp_opt.orders.patterns.pytorch_schedules import DESCRIPTIONS as PYTORCH_DESCRIPTIONS
from pp_opt.orders.patterns.pytorch_schedules import GENERATORS as PYTORCH_GENERATORS
from pp_opt.orders.patterns.vshape import zb_v
from pp_opt.orders.patterns.zero_bubble import zb_h1, zb_h2

OPTIONS = ("fraction", "deadline")
"""Keyword options a generator may take besides the problem."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One registered generator and how it is used."""

    generator: OrderGenerator
    """``(problem, **options) -> Order``."""
    description: str
    """One line for listings."""
    baseline: bool = False
    """Listed by ``pp-opt baseline`` (and :func:`pp_opt.orders.baseline_names`)."""
    warm_start: bool = False
    """Tried by :func:`pp_opt.orders.candidates` (when it keeps the problem's placement)."""
    offload_base: bool = False
    """With offload allowed, its order made without the caps is also tried with copies in
    its gaps (:func:`pp_opt.orders.offload.offload_warm.with_offloads`)."""
    placements: frozenset[str] | None = None
    """Placements whose problems it keeps (a warm start is only tried on those); None for
    any. ``v-half`` on a ``loop`` problem, say, re-splits it: fine for ``pp-opt baseline``,
    useless as a warm start."""
    pairs: bool = False
    """Its orders overlap F/B pairs: a warm start only where the problem allows pairs."""
    options: frozenset[str] = frozenset()
    """Which of :data:`OPTIONS` it takes: ``fraction`` (the largest offload fraction
    allowed), ``deadline`` (a ``time.perf_counter()`` value by which to return its best)."""

    def __post_init__(self) -> None:
        unknown = sorted(self.options - set(OPTIONS))
        if unknown:
            raise ProblemError("options", f"unknown {unknown[0]!r}; use {', '.join(OPTIONS)}")


def _classic(generator: OrderGenerator, description: str) -> Entry:
    return Entry(generator=generator, description=description, baseline=True, warm_start=True,
                 offload_base=True)  # fmt: skip


def _rule(
    generator: OrderGenerator, description: str, *options: str, offload_base: bool = False
) -> Entry:
    return Entry(generator=generator, description=description, warm_start=True,
                 offload_base=offload_base, options=frozenset(options))  # fmt: skip


def _searched(generator: OrderGenerator, description: str, placement: str) -> Entry:
    return Entry(generator=generator, description=description, baseline=True, warm_start=True,
                 placements=frozenset({placement}), options=frozenset({"deadline"}))  # fmt: skip


REGISTRY: dict[str, Entry] = {
    # The classic fixed patterns (baselines).
    "gpipe": _classic(gpipe, "GPipe: all forwards, then all backwards"),
    "1f1b": _classic(one_f_one_b, "1F1B (PipeDream-Flush), p activations"),
    "interleaved-1f1b": _classic(interleaved_1f1b, "Megatron-LM interleaved 1F1B (loop, v >= 2)"),
    "zb-h1": _classic(zb_h1, "Zero Bubble ZB-H1, p activations"),
    "zb-h2": _classic(zb_h2, "Zero Bubble ZB-H2, 2p - 1 activations"),
    "zb-v": _classic(zb_v, "Zero Bubble ZB-V, PyTorch's order (v placement)"),
    # Rules that adapt to the costs and the caps (warm starts).
    "greedy-bfw": _rule(greedy_bfw, "memory-aware list schedule: B, F, then W", offload_base=True),
    "greedy-lazy-w": _rule(
        greedy_lazy_w, "memory-aware list schedule, W deferred", offload_base=True
    ),  # fmt: skip
    "greedy-bfw-older-first": _rule(
        greedy_bfw_older_first, "memory-aware list schedule, room kept for older microbatches"
    ),  # fmt: skip
    "greedy-bfw-limited": _rule(
        greedy_bfw_limited,
        "memory-aware list schedule, the in-flight limit that times best",
        "deadline",
    ),  # fmt: skip
    # Last of the rules: it always fits a feasible cap, and is rarely the best; under a
    # short deadline (a plan's screening solves) the memory-aware rules come first.
    "fallback": _rule(fallback, "list schedule that fits any feasible cap", "fraction"),
    "zb-greedy": _rule(zb_greedy, "Zero Bubble cost-aware greedy, tuned (loop)", "deadline"),
    "zb-v-greedy": _rule(
        zb_v_greedy, "Zero Bubble ZB-V cost-aware greedy, tuned (v)", "deadline"
    ),  # fmt: skip
    # Rule schedules for tight memory (listed by `pp-opt baseline`, searched for the cap).
    "v-half": _searched(v_half, "Controllable-memory V-Half, about half of 1F1B's memory", "v"),
    "v-min": _searched(v_min, "Controllable-memory V-Min, about a third of 1F1B's memory", "v"),
    "pipeoffload": _searched(
        pipeoffload, "PipeOffload: group-interleaved 1F1B with offloaded chunks", "loop"
    ),
    # PyTorch's schedules under PyTorch's names (pp_opt.orders.patterns.pytorch_schedules): run by
    # name only; the same orders that pp_opt already has are listed above.
    **{
        name: Entry(generator=generator, description=PYTORCH_DESCRIPTIONS[name])
        for name, generator in PYTORCH_GENERATORS.items()
    },
    # Schedules with overlapped F/B pairs (pp_opt.orders.patterns.overlapped): run by name.
    "dualpipev-overlap": Entry(
        generator=dual_pipe_v_overlapped,
        description="PyTorch's DualPipeV with its OVERLAP_F_B pairs overlapped (v, m >= 2p)",
        warm_start=True,
        pairs=True,
        placements=frozenset({"v"}),
    ),
    "dualpipe": Entry(
        generator=dual_pipe,
        description="DeepSeek's DualPipe: two model copies, microbatches from both ends (dual)",
    ),
    "interleaved-1f1b-a2a": Entry(
        generator=interleaved_1f1b_a2a,
        description="Megatron-Core interleaved 1F1B with A2A overlap: steady-state F/B pairs",
        warm_start=True,
        pairs=True,
        placements=frozenset({"loop"}),
    ),
    # New generators go here: import them above and add one entry each (_classic for a
    # fixed pattern listed by `pp-opt baseline`, _rule for a warm-start rule, _searched
    # for a rule schedule that searches its own parameters).
}
"""Name -> generator entry, in the order they are listed and tried."""


def get(name: str) -> Entry:
    """The entry of ``name``; a :class:`ProblemError` listing the names otherwise."""
    entry = REGISTRY.get(name)
    if entry is None:
        raise ProblemError("name", f"unknown {name!r}; use one of {', '.join(REGISTRY)}")
    return entry
