"""What a plan searches over: the inputs of one training job, a configuration, a candidate."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pp_opt.errors import ProblemError
from pp_opt.profiler.cards import HardwareCard, ModelCard


@dataclass(kw_only=True, slots=True, frozen=True)
class PlanInputs:
    """One training job: the model, the GPUs and the batch (DESIGN.md section 8)."""

    model: ModelCard
    """The model card."""
    hardware: HardwareCard
    """The hardware card of every GPU."""
    gpus: int
    """GPUs in the job (``tp x pp x dp``)."""
    global_batch: int
    """Sequences per optimizer step."""
    seq: int
    """Sequence length."""

    def __post_init__(self) -> None:
        for name in ("gpus", "global_batch", "seq"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ProblemError(name, f"got {value!r}; expected an integer >= 1")

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.name,
            "hardware": self.hardware.name,
            "gpus": self.gpus,
            "global_batch": self.global_batch,
            "seq": self.seq,
        }


@dataclass(kw_only=True, slots=True, frozen=True)
class Config:
    """One parallel configuration (the layer split aside)."""

    tp: int
    """Tensor-parallel degree (inside one node)."""
    pp: int
    """Pipeline devices."""
    dp: int
    """Data-parallel replicas, ``gpus / (tp * pp)``."""
    v: int
    """Chunks (stages) per pipeline device."""
    placement: str
    """``loop`` or ``v``."""
    mbs: int
    """Sequences per microbatch."""
    m: int
    """Microbatches per pipeline and step, ``global_batch / (dp * mbs)``."""
    recompute: bool
    """Recomputing a forward is allowed (the solver decides per activation)."""
    offload: bool
    """Offloading activations to host memory is allowed (the solver decides)."""
    optimizer_sharding: bool
    """Optimizer state split over the ``dp`` replicas."""

    @property
    def stages(self) -> int:
        return self.pp * self.v

    def key(self) -> tuple[Any, ...]:
        """A total order for deterministic tie-breaking."""
        return (self.tp, self.pp, self.v, self.placement, self.mbs, self.recompute,
                self.offload, self.optimizer_sharding)  # fmt: skip

    def label(self) -> str:
        flags = [f for f, on in (("recompute", self.recompute), ("offload", self.offload),
                                 ("sharded", self.optimizer_sharding)) if on]  # fmt: skip
        return (
            f"tp{self.tp} pp{self.pp} dp{self.dp} {self.placement} v{self.v} mbs{self.mbs} "
            f"m{self.m}" + "".join(f" {f}" for f in flags)
        )


@dataclass(kw_only=True, slots=True, frozen=True)
class Candidate:
    """A configuration with its layer split: what one schedule is solved for."""

    config: Config
    """The configuration."""
    layers: tuple[int, ...]
    """Decoder layers per stage, in stage order (embedding on the first stage, output layer
    on the last)."""
    origin: str = "split"
    """Where the split came from (``split``: the planner's split model; a baseline's name)."""

    def key(self) -> tuple[Any, ...]:
        return (*self.config.key(), self.layers)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self.config)
        out["layers"] = list(self.layers)
        return out


@dataclass(kw_only=True, slots=True)
class Pins:
    """Values a user pinned; None searches every legal value of that dimension."""

    tp: tuple[int, ...] | None = None
    """Tensor-parallel degrees to try."""
    pp: tuple[int, ...] | None = None
    """Pipeline sizes to try."""
    v: tuple[int, ...] | None = None
    """Chunks per device to try (the ``v`` placement always has 2)."""
    placement: tuple[str, ...] | None = None
    """Placements to try (``loop``, ``v``)."""
    mbs: tuple[int, ...] | None = None
    """Microbatch sizes to try."""
    recompute: bool | None = None
    """Recompute allowed (True), not (False), or both tried (None)."""
    offload: bool | None = None
    """Offload allowed (True), not (False), or both tried (None)."""
    optimizer_sharding: bool | None = None
    """Optimizer sharding on, off, or both tried (None; off when ``dp = 1``)."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items()}
