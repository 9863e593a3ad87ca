"""One training job's parallel layout and settings: what a cost profile is made for.

The profiler, the planner and the command line all describe a configuration with one
:class:`Job` (DESIGN.md section 8; names follow torchtitan's where it has one). A new
setting is one new field here, with its check in :meth:`Job.__post_init__` and its cost in
the profiler's formulas.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pp_opt.errors import ProblemError
from pp_opt.limits import check_size
from pp_opt.placement import stage_devices

ACTIVATION_CHECKPOINT_MODES = ("none", "selective")
"""``none`` keeps every activation; ``selective`` recomputes the attention core in B."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Job:
    """The parallel layout and training settings of one configuration of a training job."""

    pp: int
    """Pipeline devices ``p`` (each one tensor-parallel group of ``tp`` GPUs)."""
    microbatches: int
    """Microbatches per pipeline and iteration ``m``."""
    seq: int
    """Sequence length ``s``."""
    tp: int = 1
    """Tensor-parallel degree ``t`` (inside one node, with sequence parallelism)."""
    dp: int = 1
    """Data-parallel replicas (``gpus = tp * pp * dp``)."""
    v: int = 1
    """Chunks (stages) per pipeline device; the ``v`` placement has 2."""
    placement: str = "loop"
    """``loop`` or ``v``."""
    mbs: int = 1
    """Sequences per microbatch ``b``."""
    layers: tuple[int, ...] = ()
    """Decoder layers per stage, in stage order (embedding on the first stage, output layer
    on the last); empty until split (:func:`pp_opt.profiler.layer_split.job_for_card`)."""
    activation_checkpoint: str = "none"
    """Activation checkpointing: one of :data:`ACTIVATION_CHECKPOINT_MODES`."""
    optimizer_sharding: bool = False
    """Optimizer state split over the ``dp`` replicas."""
    bytes_per_param: float | None = None
    """Static bytes per parameter; None: from ``dp`` and ``optimizer_sharding``
    (:func:`pp_opt.profiler.analytic.job_bytes_per_param`; 16 unsharded)."""
    tp_comm: bool = True
    """The tensor-parallel collectives are exposed (added to each layer's F and B when
    ``tp > 1``)."""

    def __post_init__(self) -> None:
        for name in ("pp", "microbatches", "seq", "tp", "dp", "v", "mbs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ProblemError(name, f"got {value!r}; expected an integer >= 1")
        if self.placement == "v" and self.v == 1:
            object.__setattr__(self, "v", 2)
        check_size(p=self.pp, v=self.v, m=self.microbatches, stages=self.stages)
        stage_devices(self.placement, self.pp, self.v)  # checks placement and v
        if self.activation_checkpoint not in ACTIVATION_CHECKPOINT_MODES:
            modes = " or ".join(ACTIVATION_CHECKPOINT_MODES)
            raise ProblemError(
                "activation_checkpoint", f"unknown {self.activation_checkpoint!r}; use {modes}"
            )
        if self.bytes_per_param is not None:
            bpp = self.bytes_per_param
            if isinstance(bpp, bool) or not isinstance(bpp, int | float) or not 0 <= bpp <= 1024:
                raise ProblemError("bytes_per_param", f"got {bpp!r}; expected 0 to 1024")
        if self.layers and len(self.layers) != self.stages:
            raise ProblemError(
                "layers",
                f"got {len(self.layers)} entries for {self.stages} stages (pp x v); give one each",
            )
        object.__setattr__(self, "layers", tuple(int(n) for n in self.layers))

    @property
    def stages(self) -> int:
        """Pipeline stages, ``pp * v``."""
        return self.pp * self.v

    @property
    def m(self) -> int:
        """``microbatches`` (DESIGN.md's ``m``)."""
        return self.microbatches

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def stage_devices(self) -> tuple[int, ...]:
        return stage_devices(self.placement, self.pp, self.v)

    def with_layers(self, layers: tuple[int, ...]) -> Job:
        return replace(self, layers=layers)

    def layout_dict(self, bytes_per_param: float) -> dict[str, Any]:
        """The ``profile.layout`` object of a cost profile file (its keys as they were)."""
        return {
            "pp": self.pp,
            "v": self.v,
            "placement": self.placement,
            "microbatches": self.microbatches,
            "mbs": self.mbs,
            "seq": self.seq,
            "tp": self.tp,
            "layers": list(self.layers),
            "recompute": self.activation_checkpoint,
            "bytes_per_param": float(bytes_per_param),
        }

    @classmethod
    def from_layout_dict(cls, data: dict[str, Any], **more: Any) -> Job:
        """Inverse of :meth:`layout_dict` (``more``: fields the file does not carry)."""
        return cls(
            pp=data["pp"], v=data.get("v", 1), placement=data.get("placement", "loop"),
            microbatches=data["microbatches"], mbs=data.get("mbs", 1), seq=data["seq"],
            tp=data.get("tp", 1), layers=tuple(data.get("layers", ())),
            activation_checkpoint=data.get("recompute", "none"),
            bytes_per_param=data.get("bytes_per_param"), **more,
        )  # fmt: skip

    def label(self) -> str:
        return (
            f"tp{self.tp} pp{self.pp} dp{self.dp} {self.placement} v{self.v} mbs{self.mbs} "
            f"m{self.microbatches}"
        )
