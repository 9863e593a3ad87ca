"""The parallel layout a profile is made for, and how layers are split into stages."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pp_opt.arguments import number
from pp_opt.errors import ProblemError
from pp_opt.limits import check_size
from pp_opt.placement import stage_devices
from pp_opt.profiler.cards import ModelCard
from pp_opt.profiler.formulas import RECOMPUTE_MODES


@dataclass(kw_only=True, slots=True, frozen=True)
class Layout:
    """Pipeline size, chunks, placement, microbatching, tensor parallelism, layer split."""

    pp: int
    """Pipeline size ``p`` (devices; each device is one tensor-parallel group of ``tp`` GPUs)."""
    v: int = 1
    """Chunks per device (2 for the ``v`` placement)."""
    placement: str = "loop"
    """``loop`` or ``v``."""
    microbatches: int
    """Microbatches per iteration ``m``."""
    mbs: int = 1
    """Microbatch size ``b`` (sequences per microbatch)."""
    seq: int
    """Sequence length ``s``."""
    tp: int = 1
    """Tensor-parallel degree ``t`` (with sequence parallelism)."""
    layers: tuple[int, ...] = ()
    """Decoder layers per stage, in stage order (filled in by :func:`make_layout`)."""
    recompute: str = "none"
    """``none`` or ``selective`` (recompute the attention core)."""
    bytes_per_param: float = 16.0
    """Static bytes per parameter: bf16 weights 2 + bf16 grads 2 + fp32 master 4 + Adam 8."""

    @property
    def num_stages(self) -> int:
        return self.pp * self.v

    @property
    def stage_devices(self) -> tuple[int, ...]:
        return stage_devices(self.placement, self.pp, self.v)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["layers"] = list(self.layers)
        return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def suggest_split(total: int, stages: int) -> list[int]:
    """A balanced split that gives the end stages one layer less when that divides evenly.

    The end stages also run the embedding and the output layer; the Zero Bubble paper counts
    each as about one layer (22 layers on 8 stages: ``[2, 3, 3, 3, 3, 3, 3, 2]``).
    """
    if stages > 1 and (total + 2) % stages == 0 and (total + 2) // stages >= 2:
        per = (total + 2) // stages
        return [per - 1] + [per] * (stages - 2) + [per - 1]
    base, rest = divmod(total, stages)
    return [base + (1 if s < rest else 0) for s in range(stages)]


def split_layers(
    card: ModelCard, stages: int, layers: list[int] | tuple[int, ...] | None
) -> tuple[int, ...]:
    """Decoder layers per stage: an even split, or ``layers`` checked against the card."""
    if layers:
        split = tuple(int(n) for n in layers)
        if len(split) != stages:
            raise ProblemError(
                "layers", f"got {len(split)} entries for {stages} stages (pp x v); give one each"
            )
        if any(n < 0 for n in split) or sum(split) != card.layers:
            raise ProblemError(
                "layers",
                f"entries sum to {sum(split)}, the model has {card.layers} layers; "
                f"e.g. {suggest_split(card.layers, stages)}",
            )
        return split
    if card.layers % stages:
        options = _divisors(card.layers)
        raise ProblemError(
            "layers",
            f"{card.layers} layers do not split evenly into {stages} stages (pp x v); "
            f"use a stage count in {options} or give an uneven split, "
            f"e.g. layers={suggest_split(card.layers, stages)}",
        )
    return (card.layers // stages,) * stages


def make_layout(
    card: ModelCard,
    *,
    pp: int,
    v: int = 1,
    placement: str = "loop",
    microbatches: int,
    mbs: int = 1,
    seq: int | None = None,
    tp: int = 1,
    layers: list[int] | tuple[int, ...] | None = None,
    recompute: str = "none",
    bytes_per_param: float = 16.0,
) -> Layout:
    """Check a layout against a model card and split its layers into stages."""
    for name, value in (("pp", pp), ("v", v), ("microbatches", microbatches), ("mbs", mbs),
                        ("tp", tp)):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ProblemError(name, f"got {value!r}; expected an integer >= 1")
    if placement == "v" and v == 1:
        v = 2
    check_size(p=pp, v=v, m=microbatches, stages=pp * v)
    number("bytes_per_param", bytes_per_param, low=0.0, high=1024.0)
    stage_devices(placement, pp, v)  # checks placement and v
    if card.heads % tp or card.num_kv_heads % tp:
        ok = [t for t in _divisors(card.num_kv_heads)]
        raise ProblemError("tp", f"{tp} does not divide the heads; use one of {ok}")
    if recompute not in RECOMPUTE_MODES:
        modes = " or ".join(RECOMPUTE_MODES)
        raise ProblemError("recompute", f"unknown {recompute!r}; use {modes}")
    s = card.seq if seq is None else seq
    if isinstance(s, bool) or not isinstance(s, int) or s < 1:
        raise ProblemError("seq", f"got {s!r}; expected an integer >= 1")
    return Layout(
        pp=pp, v=v, placement=placement, microbatches=microbatches, mbs=mbs, seq=s, tp=tp,
        layers=split_layers(card, pp * v, layers), recompute=recompute,
        bytes_per_param=float(bytes_per_param),
    )  # fmt: skip
